#include "worker/data/datasets.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/host_memory.h"
#include "worker/data/fashion_mnist.h"
#include "ddp/data.h"
#include "ddp/launch_env.h"
#include "worker/data/image_folder.h"
#include "worker/data/synthetic.h"
#include "worker/data/tensor_files.h"

namespace ddp::worker {
namespace {

// What a mapped copy cannot carry: the normalisation and the model's input shape.
nlohmann::json describe(const Datasets& d) {
  return {{"train_mean", d.train.mean}, {"train_std", d.train.stddev},
          {"test_mean", d.test.mean},   {"test_std", d.test.stddev},
          {"input", {d.input.channels, d.input.height, d.input.width, d.input.classes}}};
}

Datasets fromShared(const std::vector<at::Tensor>& t, const nlohmann::json& j) {
  Datasets d;
  d.train = data::TensorDataset{t.at(0), t.at(1), j.at("train_mean").get<std::vector<float>>(),
                                j.at("train_std").get<std::vector<float>>()};
  d.test = data::TensorDataset{t.at(2), t.at(3), j.at("test_mean").get<std::vector<float>>(),
                               j.at("test_std").get<std::vector<float>>()};
  const auto input = j.at("input").get<std::vector<int64_t>>();
  d.input = InputSpec{input.at(0), input.at(1), input.at(2), input.at(3)};
  return d;
}

// makeSynthetic's tensors (float32 images [N, F], the rule [F, C], the scores [N, C]) before any is
// allocated: keys that ask for more than the host has are one line naming them, not an allocator
// error from deep inside LibTorch.
void checkSyntheticFits(const DataConfig& config, const data::SyntheticOptions& opts) {
  double features = 1;
  for (int64_t d : opts.shape) features *= static_cast<double>(d);
  const double n = static_cast<double>(opts.size);
  const double classes = static_cast<double>(opts.numClasses);
  const double bytes = 4.0 * (n * features + features * classes + n * classes) + 8.0 * n;
  const MemoryLimit memory = memoryLimit();
  if (memory.bytes <= 0 || bytes <= memory.bytes) return;
  DDP_THROW(ConfigError, "config: data.synthetic_train=", config.syntheticTrain, ", data.synthetic_test=",
            config.syntheticTest, " and data.synthetic_classes=", config.syntheticClasses, " need about ", formatBytes(bytes),
            " to generate (images, labelling rule, scores) but ", describeMemory(memory),
            "; use fewer samples or classes");
}

// data.name image_folder when it streams (data.stream, and auto's reasons; it takes `index` then),
// else nullopt.
std::optional<Datasets> streamedDatasets(const DataConfig& config, data::ImageIndex& index) {
  if (config.stream == "false") return std::nullopt;
  std::string why;
  if (!data::streamsImages(config, index, &why)) return std::nullopt;
  Datasets d;
  const auto classes = static_cast<int64_t>(index.classes.size());
  d.images = data::streamedImages(config, std::move(index));
  d.input = InputSpec{3, config.imageSize, config.imageSize, classes};
  if (launchEnv().rank == 0) spdlog::info("data: streaming the images: {}", why);
  return d;
}

// ImageFolder's layout decoded into memory (uint8, one copy per host); kEvalOnly decodes the
// evaluation split only (its classes its own when there is no train/), kTrainOnly the training
// split only (the evaluation split is then empty, of the training images' shape).
// `index`: the listing a stream reads too (openImageIndex: torchvision's ImageFolder order, linked
// folders followed, the splits' classes agreed; eval alone without train/: the evaluation split's own).
Datasets loadImageFolder(const DataConfig& config, const data::ImageIndex& index) {
  Datasets d;
  const std::vector<std::string>& classes = index.classes;
  data::ImageFolderOptions o;
  o.resize = config.imageSize;
  o.maxPixels = config.maxImagePixels;
  if (!config.mean.empty()) o.mean = config.mean;
  if (!config.stddev.empty()) o.stddev = config.stddev;
  o.threads = config.numWorkers > 0 ? static_cast<int>(config.numWorkers)
                                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (index.splits == Splits::kTrainOnly) {
    d.train = data::loadImageFolderSplit(*index.train, o);
    std::vector<int64_t> none = d.train.images.sizes().vec();
    none.front() = 0;
    d.test = data::TensorDataset{at::empty(none, d.train.images.options()), at::empty({0}, at::kLong),
                                 d.train.mean, d.train.stddev};
    d.input = InputSpec{3, d.train.images.size(2), d.train.images.size(3), static_cast<int64_t>(classes.size())};
    return d;
  }
  d.test = data::loadImageFolderSplit(*index.test, o);
  if (index.splits == Splits::kEvalOnly) {
    d.input = InputSpec{3, d.test.images.size(2), d.test.images.size(3), static_cast<int64_t>(classes.size())};
    return d;
  }
  d.train = data::loadImageFolderSplit(*index.train, o);
  if (d.train.images.sizes().slice(1) != d.test.images.sizes().slice(1)) {
    DDP_THROW(DataError, "data: the train images are ", d.train.images.size(3), "x", d.train.images.size(2),
              " but the test images are ", d.test.images.size(3), "x", d.test.images.size(2),
              "; set data.image_size to resize both");
  }
  d.input = InputSpec{3, d.train.images.size(2), d.train.images.size(3), static_cast<int64_t>(classes.size())};
  return d;
}

}  // namespace

data::SampleSource Datasets::trainSource() const {
  return images ? data::streamedSource(images, /*train=*/true) : data::SampleSource::inMemory(train);
}

data::SampleSource Datasets::testSource() const {
  return images ? data::streamedSource(images, /*train=*/false) : data::SampleSource::inMemory(test);
}

std::string describeSizes(const Datasets& data) {
  if (data.images) {
    if (!data.images->index.test) return fmt::format("({} train images, streamed)", data.images->trainSize());
    return fmt::format("({} train / {} test images, streamed)", data.images->trainSize(),
                       data.images->index.test->size());
  }
  if (data.tokens) {
    return fmt::format("({} train / {} val tokens)", data.tokens->train->totalTokens(),
                       data.tokens->val ? data.tokens->val->totalTokens() : 0);
  }
  return fmt::format("({} train / {} test)", data.train.size(), data.test.size());
}

namespace {

// loadDatasets, with an image folder's index when the caller listed it already.
Datasets loadListed(const DataConfig& config, uint64_t seed, Splits splits, data::ImageIndex* listed) {
  Datasets d;
  if (config.name == "tokens") {
    d.tokens = std::make_shared<const data::TokenCorpus>(data::loadTokenCorpus(config));
    d.input = InputSpec{1, 1, 1, d.tokens->vocabSize};
    return d;
  }
  if (config.name == "fashion-mnist") {
    d.train = data::loadFashionMnist(config.root, data::Split::kTrain);
    d.test = data::loadFashionMnist(config.root, data::Split::kTest);
    d.input = InputSpec{1, 28, 28, 10};
  } else if (config.name == "image_folder") {
    std::optional<data::ImageIndex> own;
    if (listed == nullptr) own = data::openImageIndex(config, splits);  // listed once
    data::ImageIndex& index = listed != nullptr ? *listed : *own;
    if (auto streamed = streamedDatasets(config, index)) return std::move(*streamed);
    d = loadImageFolder(config, index);
  } else if (config.name == "tensors") {
    d.train = data::loadTensorFile(config.trainFile, "data.train_file");
    d.test = data::loadTensorFile(config.testFile, "data.test_file");
    const auto sample = [](const data::TensorDataset& t) { return t.images.sizes().slice(1).vec(); };
    if (sample(d.train) != sample(d.test)) {
      DDP_THROW(DataError, "data: the samples of data.train_file are ", c10::IntArrayRef(sample(d.train)),
                " but those of data.test_file are ", c10::IntArrayRef(sample(d.test)), "; both splits need one shape");
    }
    int64_t largest = -1;
    for (const auto* split : {&d.train, &d.test}) {
      if (split->size() > 0) largest = std::max(largest, split->labels.max().item<int64_t>());
    }
    const int64_t classes = config.classes > 0 ? config.classes : largest + 1;
    if (largest >= classes) {
      DDP_THROW(ConfigError, "config: 'data.classes' is ", classes, " but the data holds label ", largest,
                "; raise data.classes or set it to 0 (the largest label + 1)");
    }
    if (classes < 2) DDP_THROW(DataError, "data: the labels hold fewer than 2 classes; a classifier needs at least 2");
    d.input = InputSpec{d.train.images.size(1), d.train.images.size(2), d.train.images.size(3), classes};
  } else {
    data::SyntheticOptions opts;
    opts.size = config.syntheticTrain + config.syntheticTest;
    opts.numClasses = config.syntheticClasses;
    opts.seed = seed;
    checkSyntheticFits(config, opts);
    auto all = data::makeSynthetic(opts);
    d.train = all.rows(0, config.syntheticTrain);
    d.test = all.rows(config.syntheticTrain, config.syntheticTest);
    d.input = InputSpec{opts.shape[0], opts.shape[1], opts.shape[2], config.syntheticClasses};
  }
  if (config.trainLimit > 0 && config.trainLimit < d.train.size()) {
    d.train = d.train.rows(0, config.trainLimit);
  }
  return d;
}

}  // namespace

Datasets loadDatasets(const DataConfig& config, uint64_t seed, Splits splits) {
  return loadListed(config, seed, splits, nullptr);
}

data::LoaderOptions loaderOptions(const DataConfig& config, c10::Device device, uint64_t seed, int64_t epoch) {
  data::LoaderOptions o;
  o.numWorkers = static_cast<int>(config.numWorkers >= 0 ? config.numWorkers : device.is_cuda() ? 2 : 0);
  o.prefetchBatches = static_cast<int>(config.prefetchBatches);
  o.pinMemory = config.pinMemory;
  o.device = device;
  o.augment.rotateDegrees = config.rotateDegrees;
  o.augment.cropPadding = static_cast<int>(config.cropPadding);
  o.augment.horizontalFlip = config.horizontalFlip;
  o.seed = seed;
  o.epoch = epoch;
  o.delayMs = data::debugLoaderDelayMs(launchEnv().rank);
  return o;
}

Splits splitsOf(const WorkerConfig& config) {
  if (config.mode == Mode::kEval) return Splits::kEvalOnly;
  return config.eval.enabled ? Splits::kTrainAndEval : Splits::kTrainOnly;
}

Datasets loadDatasetsOncePerHost(const DataConfig& config, uint64_t seed, const GroupStart& start,
                                 Splits splits, DataOrigin* origin) {
  std::optional<data::ImageIndex> listed;  // an image folder: listed once, here
  if (config.name == "image_folder") {  // streamed images are read per batch: nothing to share
    listed = data::openImageIndex(config, splits);
    if (auto streamed = streamedDatasets(config, *listed)) {
      if (origin != nullptr) *origin = DataOrigin::kLoaded;
      return std::move(*streamed);
    }
  }
  if (config.name == "tokens") {  // memory-mapped: the page cache is the host's one copy
    if (origin != nullptr) {
      *origin = start.localRank() == 0 ? DataOrigin::kSharedByThisRank : DataOrigin::kMappedFromHostCopy;
    }
    return loadDatasets(config, seed, splits);
  }
  const HostCopy copy = loadOncePerHost(start, [&] {
    const Datasets loaded = loadListed(config, seed, splits, listed ? &*listed : nullptr);
    return HostData{{loaded.train.images, loaded.train.labels, loaded.test.images, loaded.test.labels},
                    describe(loaded).dump()};
  });
  if (origin != nullptr) *origin = copy.origin;
  return fromShared(copy.tensors, nlohmann::json::parse(copy.meta));
}

}  // namespace ddp::worker
