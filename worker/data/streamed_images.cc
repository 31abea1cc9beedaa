#include "worker/data/streamed_images.h"

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/relative_path.h"
#include "common/host_memory.h"
#include "ddp/launch_env.h"
#include "worker/data/augment.h"

namespace ddp::worker::data {
namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& c : v) s += (s.empty() ? "" : ", ") + c;
  return s;
}

// The decoded size of both splits as the in-memory path would hold them: uint8, 3 channels, at
// data.image_size, else at the first training image's size (that path needs all sizes equal).
double decodedBytes(const DataConfig& config, const ImageIndex& index) {
  double pixels = static_cast<double>(config.imageSize) * static_cast<double>(config.imageSize);
  if (config.imageSize <= 0 && index.train->size() > 0) {
    const std::vector<uint8_t> first = index.train->read(0);
    const ImageHeader h = readImageHeader(first.data(), first.size(), index.train->name(0));
    pixels = static_cast<double>(h.height) * static_cast<double>(h.width);
  }
  const int64_t images = index.splits == Splits::kEvalOnly ? index.testSize() : index.train->size() + index.testSize();
  return 3.0 * pixels * static_cast<double>(images);
}

ImageTransformOptions transformOf(const DataConfig& config, bool train) {
  ImageTransformOptions t;
  t.size = config.imageSize;
  t.dctScaling = config.jpegDctScaling;
  t.maxPixels = config.maxImagePixels;
  if (config.trainTransform == "imagenet") {
    t.kind = train ? ImageTransformKind::kTrain : ImageTransformKind::kEval;
  } else {
    t.kind = ImageTransformKind::kResize;
  }
  return t;
}

// RandomRotation / RandomCrop(padding) / RandomHorizontalFlip on the transformed picture, as the
// in-memory path augments its stored uint8 images (augmentImage: [C, H, W]; RgbImage is [H, W, 3]).
void augmentPicture(RgbImage& image, const AugmentOptions& augment, uint64_t seed, int64_t epoch, int64_t index) {
  const int64_t plane = image.height * image.width;
  std::vector<uint8_t> planar(static_cast<size_t>(3 * plane)), out(planar.size());
  for (int64_t p = 0; p < plane; ++p) {
    for (int64_t c = 0; c < 3; ++c) planar[static_cast<size_t>(c * plane + p)] = image.pixels[static_cast<size_t>(p * 3 + c)];
  }
  augmentImage(planar.data(), out.data(), 3, image.height, image.width, augment, seed, epoch, index);
  for (int64_t p = 0; p < plane; ++p) {
    for (int64_t c = 0; c < 3; ++c) image.pixels[static_cast<size_t>(p * 3 + c)] = out[static_cast<size_t>(c * plane + p)];
  }
}

Batch decodeBatch(const StreamedImages& images, bool train, uint64_t seed, int64_t epoch,
                  const std::vector<int64_t>& items, const AugmentOptions& augment) {
  c10::NoGradGuard noGrad;
  const ImageDataset& dataset = train ? *images.index.train : *images.index.test;
  const ImageTransformOptions& transform = train ? images.trainTransform : images.evalTransform;
  const int64_t side = transform.size;
  const auto n = static_cast<int64_t>(items.size());
  at::Tensor pixels = at::empty({n, 3, side, side}, at::kFloat);
  at::Tensor labels = at::empty({n}, at::kLong);
  int64_t kept = 0;
  for (const int64_t index : items) {
    RgbImage image;
    try {
      const std::vector<uint8_t> bytes = dataset.read(index);
      image = transformImage(bytes.data(), bytes.size(), dataset.name(index), transform, seed, epoch, index);
      if (augment.any()) augmentPicture(image, augment, seed, epoch, index);
    } catch (const DataError& e) {
      if (!images.skipBadImages) throw;
      spdlog::warn("data: skipped a bad image (data.skip_bad_images): {}", e.what());
      ++*images.skipped;
      continue;
    }
    normalizeImage(image, pixels.data_ptr<float>() + kept * 3 * side * side, images.mean, images.stddev);
    labels.data_ptr<int64_t>()[kept] = dataset.label(index);
    ++kept;
  }
  if (kept == 0 && n > 0) {
    DDP_THROW(DataError, "data: every image of a batch was bad (the first: ", dataset.name(items.front()),
              "); check the data set");
  }
  return Batch{pixels.narrow(0, 0, kept), labels.narrow(0, 0, kept)};
}

}  // namespace

namespace {

void requireImageRoot(const std::string& root) {
  if (!std::filesystem::is_directory(root)) {
    DDP_THROW(DataError, "data: data.root '", root, "'", relativePathNote(root), " is not a directory; ImageFolder's "
              "layout is ", root, "/train/<class>/... and ", root, "/val/<class>/...");
  }
}

// data.train_files / data.val_files: a glob that matches nothing is the key's mistake (exit 2), as
// for token shards; what is wrong inside a shard is data.
void requireShards(const char* key, const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  const size_t found = rc == 0 ? g.gl_pathc : 0;
  ::globfree(&g);
  if (found == 0) {
    DDP_THROW(ConfigError, "config: '", key, "' matches no file: '", pattern, "'", relativePathNote(pattern),
              "; give a glob of WebDataset tar shards (e.g. /data/imagenet/", key == std::string("data.val_files") ? "val" : "train",
              "-*.tar)");
  }
}

}  // namespace

std::string imageFolderEvalDir(const std::string& root) {
  namespace fs = std::filesystem;
  requireImageRoot(root);
  const fs::path test = fs::path(root) / "test";
  const fs::path val = fs::path(root) / "val";
  // val/ first (torchvision's ImageNet, the shipped configs): an ImageNet copy may carry a test/
  // folder too (unlabelled, or Kaggle's), which is not the evaluation split.
  if (fs::is_directory(val)) {
    if (fs::is_directory(test) && launchEnv().rank == 0) {
      static std::once_flag said;
      std::call_once(said, [&] {
        spdlog::warn("data: {} and {} both exist: evaluating on {} (torchvision's ImageNet layout; {} is left alone)",
                     val.string(), test.string(), val.string(), test.string());
      });
    }
    return val.string();
  }
  if (!fs::is_directory(test)) {
    DDP_THROW(DataError, "data: '", root, "' has no val/ (or test/) folder of <class>/ folders for evaluation; "
              "ImageFolder's layout is ", root, "/train/<class>/... and ", root, "/val/<class>/...");
  }
  return test.string();
}

ImageIndex openImageIndex(const DataConfig& config, Splits splits) {
  ImageIndex index;
  index.splits = splits;
  const bool evalOnly = splits == Splits::kEvalOnly;
  const bool trainOnly = splits == Splits::kTrainOnly;
  if (!config.trainFiles.empty()) {
    requireShards("data.train_files", config.trainFiles);
    if (!config.valFiles.empty() && !trainOnly) requireShards("data.val_files", config.valFiles);
    index.train = std::make_shared<const ImageDataset>(ImageDataset::tarShards(config.trainFiles));
    if (config.valFiles.empty() && !trainOnly) {
      DDP_THROW(ConfigError, "config: 'data.train_files' is tar shards but data.val_files is empty; give the "
                "evaluation split's shards (or set eval.enabled: false to train without evaluating)");
    }
    if (!trainOnly) index.test = std::make_shared<const ImageDataset>(ImageDataset::tarShards(config.valFiles));
  } else {
    namespace fs = std::filesystem;
    const fs::path trainDir = fs::path(config.root) / "train";
    if (trainOnly) {
      requireImageRoot(config.root);
      if (!fs::is_directory(trainDir)) {
        DDP_THROW(DataError, "data: '", config.root, "' has no train/ folder of <class>/ folders; ImageFolder's "
                  "layout is ", config.root, "/train/<class>/... (and ", config.root, "/val/<class>/... to evaluate)");
      }
      index.train = std::make_shared<const ImageDataset>(ImageDataset::folder(trainDir.string()));
      index.classes = index.train->classes();
      return index;
    }
    index.test = std::make_shared<const ImageDataset>(ImageDataset::folder(imageFolderEvalDir(config.root)));
    if (evalOnly && !fs::is_directory(trainDir)) {
      index.train = index.test;  // the classes: the evaluation split's folders, as ImageFolder(val) maps them
    } else {
      index.train = std::make_shared<const ImageDataset>(ImageDataset::folder(trainDir.string()));
    }
    if (index.train->classes() != index.test->classes()) {
      DDP_THROW(DataError, "data: ", (fs::path(config.root) / "train").string(), " has classes [",
                joined(index.train->classes()), "] but ", imageFolderEvalDir(config.root), " has [",
                joined(index.test->classes()), "]; both splits need the same class folders");
    }
  }
  index.classes = index.train->classes();
  if (index.test && index.test->classes().size() > index.classes.size()) {
    DDP_THROW(DataError, "data: the evaluation shards hold label ", index.test->classes().size() - 1,
              " but the training shards only labels up to ", index.classes.size() - 1,
              "; both splits need the same classes");
  }
  return index;
}

bool streamsImages(const DataConfig& config, const ImageIndex& index, std::string* why) {
  const auto say = [why](const std::string& text) {
    if (why != nullptr) *why = text;
    return true;
  };
  if (config.stream == "true") return say("data.stream: true");
  if (config.stream == "false") return false;
  if (!config.trainFiles.empty()) return say("tar shards are read as a stream");
  if (config.trainTransform == "imagenet") return say("data.train_transform: imagenet crops each image anew");
  // Only a stream meets its bad images one by one; decoding the set up front stops at the first.
  if (config.skipBadImages) return say("data.skip_bad_images: bad images are left out as the batches meet them");  // needs image_size (a config rule)
  const double budget = config.memoryBudgetMb > 0 ? static_cast<double>(config.memoryBudgetMb) * 1024 * 1024
                                                  : hostMemoryBytes() / 4;
  const double bytes = decodedBytes(config, index);
  if (budget > 0 && bytes > budget) {
    return say(fmt::format("decoded, the images would take {:.0f} MiB, over data.memory_budget_mb ({:.0f} MiB)",
                           bytes / (1024 * 1024), budget / (1024 * 1024)));
  }
  return false;
}

std::shared_ptr<const StreamedImages> streamedImages(const DataConfig& config, ImageIndex index) {
  if (config.imageSize <= 0) {
    DDP_THROW(ConfigError, "config: streamed images (data.stream) need data.image_size, the side of the square "
              "each image is cropped or resized to, e.g. 224");
  }
  auto images = std::make_shared<StreamedImages>();
  images->index = std::move(index);
  images->trainTransform = transformOf(config, /*train=*/true);
  images->evalTransform = transformOf(config, /*train=*/false);
  // The config resolves an empty data.mean / data.std (ImageNet's with the imagenet transform, else
  // 0 and 1: resolveNormalisation), as the in-memory path reads them.
  DDP_ENFORCE(config.mean.size() == 3 && config.stddev.size() == 3,
              "streamedImages: data.mean and data.std need 3 values each (a config's build() resolves them)");
  images->mean = config.mean;
  images->stddev = config.stddev;
  images->skipBadImages = config.skipBadImages;
  images->trainLimit = config.trainLimit;
  if (config.numWorkers < 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    images->autoThreads = std::max(1, cores / std::max(1, launchEnv().localWorldSize));
  }
  return images;
}

SampleSource streamedSource(std::shared_ptr<const StreamedImages> images, bool train) {
  if (!train && !images->index.test) {
    DDP_THROW(ConfigError, "config: this job was started with eval.enabled false and opened no evaluation split; "
              "set eval.enabled: true to evaluate");
  }
  const int64_t size = train ? images->trainSize() : images->index.test->size();
  return SampleSource(size, [images = std::move(images), train](std::vector<std::vector<int64_t>> plan,
                                                                 LoaderOptions options) {
    const uint64_t seed = options.seed;
    const int64_t epoch = options.epoch;
    const AugmentOptions augment = options.augment;  // evaluation's loaders have none
    options.augment = {};  // applied per picture here, after the transform
    if (images->autoThreads > 0) options.numWorkers = images->autoThreads;
    auto gather = [images, train, seed, epoch, augment](const std::vector<int64_t>& items) {
      return decodeBatch(*images, train, seed, epoch, items, augment);
    };
    return std::make_unique<BatchLoader>(std::move(gather), std::move(plan), std::move(options));
  });
}

}  // namespace ddp::worker::data
