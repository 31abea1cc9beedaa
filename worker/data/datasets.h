// Which data set a job trains on, and one copy of it per host.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/data.h"
#include "worker/config/config.h"
#include "worker/data/batch_loader.h"
#include "worker/data/sample_source.h"
#include "worker/data/streamed_images.h"
#include "worker/data/tensor_dataset.h"
#include "worker/data/token_corpus.h"
#include "worker/models/models.h"

namespace ddp::worker {

struct Datasets {
  data::TensorDataset train;
  data::TensorDataset test;
  InputSpec input;  // tokens: classes = the vocabulary of meta.json (0 when unknown)
  std::shared_ptr<const data::TokenCorpus> tokens;  // data.name tokens (train and test are empty)
  std::shared_ptr<const data::StreamedImages> images;  // image_folder streamed (train and test are empty)

  /// The training and the evaluation split as the loop reads them (in memory or streamed).
  data::SampleSource trainSource() const;
  data::SampleSource testSource() const;
};

/// "(60000 train / 10000 test)", or for tokens "(1234567 train / 4567 val tokens)".
std::string describeSizes(const Datasets& data);

/// Which splits a job reads (data::Splits): an image folder's evaluation split is not needed with
/// eval.enabled false (kTrainOnly), nor its training split in mode eval (kEvalOnly). The other
/// data sets load both splits whatever this says.
using Splits = data::Splits;

/// The splits a job of `config` reads: kEvalOnly in mode eval, kTrainOnly with eval.enabled false.
Splits splitsOf(const WorkerConfig& config);

/// Loads the configured data set in this process (data.name selects the source).
Datasets loadDatasets(const DataConfig& config, uint64_t seed, Splits splits = Splits::kTrainAndEval);

/// The loader's options for this job's `device`: data.num_workers (-1 = 0 on CPU, 2 on a GPU),
/// prefetch, pinning, and the training-set augmentation drawn from (seed, epoch, sample).
data::LoaderOptions loaderOptions(const DataConfig& config, c10::Device device, uint64_t seed, int64_t epoch);

/// How a rank came by its data (for the log and the tests).
using DataOrigin = HostCopyOrigin;

/// The data set with one copy per host (ddp::loadOncePerHost): the first rank of each host to ask
/// loads it (loadDatasets) into shared memory; every other rank of that host maps the same pages
/// read-only, or loads the data itself, with a warning, when it cannot open the copy. If the loading
/// rank fails, every rank of the host throws the same error instead of waiting.
Datasets loadDatasetsOncePerHost(const DataConfig& config, uint64_t seed, const GroupStart& start,
                                 Splits splits, DataOrigin* origin = nullptr);

}  // namespace ddp::worker
