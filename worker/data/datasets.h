// Which data set a job trains on, and one copy of it per host.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>

#include "worker/config/config.h"
#include "worker/data/batch_loader.h"
#include "worker/data/tensor_dataset.h"
#include "worker/models/models.h"

namespace ddp::worker {

struct Datasets {
  data::TensorDataset train;
  data::TensorDataset test;
  InputSpec input;
};

/// Loads the configured data set in this process (data.name selects the source).
Datasets loadDatasets(const DataConfig& config, uint64_t seed);

/// The loader's options for this job's `device`: data.num_workers (-1 = 0 on CPU, 2 on a GPU),
/// prefetch, pinning, and the training-set augmentation drawn from (seed, epoch, sample).
data::LoaderOptions loaderOptions(const DataConfig& config, c10::Device device, uint64_t seed, int64_t epoch);

/// How a rank came by its data (for the log and the tests).
enum class DataOrigin { kLoaded, kSharedByThisRank, kMappedFromHostCopy, kLoadedAfterMapFailed };

/// The data set with one copy per host: the first rank of each host to ask the store loads it
/// (loadDatasets) into a sealed memfd (data::SharedTensors); every other rank of that host maps
/// the same pages read-only. The ranks of a host are told apart from other hosts' by hostname
/// and boot id. A rank that cannot open the copy (another pid namespace, /proc with hidepid)
/// loads the data itself, with a warning. If the loading rank fails, every rank of the host
/// throws the same error (same class, same line) instead of waiting. The loading rank returns
/// only once the other `ranksOnHost - 1` ranks have the copy (or its error): were it to fail right
/// after (a model too large), the store it hosts must not vanish before they read the key.
Datasets loadDatasetsOncePerHost(const DataConfig& config, uint64_t seed, c10d::Store& store,
                                 std::chrono::milliseconds timeout, int ranksOnHost,
                                 DataOrigin* origin = nullptr);

/// hostname + "/" + boot id: one name per running machine (boot id tells apart containers or
/// hosts that share a hostname).
std::string hostIdentity();

}  // namespace ddp::worker
