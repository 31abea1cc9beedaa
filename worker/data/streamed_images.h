// data.name image_folder, streamed (issue 43): the samples are read and decoded per batch on the
// loader's threads through <ddp/image_data.h>, never the whole set in memory, with torchvision's
// ImageNet recipe (data.train_transform: imagenet) or a plain resize (none). Sources: data.root in
// ImageFolder's layout (train/ and test/ or val/), or WebDataset tar shards (data.train_files,
// data.val_files).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/image_data.h"
#include "worker/config/config.h"
#include "worker/data/sample_source.h"

namespace ddp::worker::data {

/// The evaluation split of an ImageFolder root: root/val (ImageNet's), else root/test (the
/// worker's layout).
std::string imageFolderEvalDir(const std::string& root);

/// Which splits a job reads: training reads both; mode eval only the evaluation split (an image
/// folder's training images are then neither decoded nor needed: without train/, the classes are
/// the evaluation split's folders); training with eval.enabled false only the training split (the
/// evaluation split may be missing, and is neither listed nor decoded).
enum class Splits { kTrainAndEval, kEvalOnly, kTrainOnly };

/// The two splits' indexes (nothing decoded yet).
struct ImageIndex {
  std::shared_ptr<const ImageDataset> train;
  /// Null with Splits::kTrainOnly.
  std::shared_ptr<const ImageDataset> test;
  std::vector<std::string> classes;  // the training split's
  /// kEvalOnly: `train` may be the evaluation split itself.
  Splits splits = Splits::kTrainAndEval;
  int64_t testSize() const { return test ? test->size() : 0; }
};

/// data.root/train and data.root/val (or test), or the data.train_files / data.val_files tar
/// globs. Throws DataError naming what is missing, and when the splits' classes differ.
/// kEvalOnly (mode eval): an image folder without train/ takes its classes from the evaluation
/// split (torchvision's ImageFolder(val) mapping; with train/, the two must agree as always).
/// kTrainOnly (eval.enabled false): the evaluation split is not opened.
ImageIndex openImageIndex(const DataConfig& config, Splits splits = Splits::kTrainAndEval);

/// Whether the job streams: data.stream true; auto: tar shards, data.train_transform imagenet, or
/// decoded splits (uint8, data.image_size² or the first image's size) beyond data.memory_budget_mb
/// (0: a quarter of this host's memory). `why` says which, for the log.
bool streamsImages(const DataConfig& config, const ImageIndex& index, std::string* why = nullptr);

struct StreamedImages {
  ImageIndex index;
  ImageTransformOptions trainTransform;  // imagenet: RandomResizedCrop + flip; none: resize
  ImageTransformOptions evalTransform;   // imagenet: Resize(size * 8 / 7) + CenterCrop; none: resize
  std::vector<float> mean;               // Normalize, after x / 255
  std::vector<float> stddev;
  bool skipBadImages = false;
  /// data.train_limit: only the first N training samples (0: all), as in memory.
  int64_t trainLimit = 0;
  /// The training samples an epoch draws from: the index's, or data.train_limit's first ones.
  int64_t trainSize() const {
    const int64_t all = index.train->size();
    return trainLimit > 0 && trainLimit < all ? trainLimit : all;
  }
  /// data.num_workers -1 (auto): decoding threads per rank, the host's cores over its ranks (at
  /// least 1; decoding is the work here, unlike gathering rows held in memory); 0: as configured.
  int autoThreads = 0;
  /// Images this process left out as bad (data.skip_bad_images).
  std::shared_ptr<std::atomic<int64_t>> skipped = std::make_shared<std::atomic<int64_t>>(0);
  int64_t size() const { return trainTransform.size; }
};

/// The streamed data set of `config` over `index`. Throws ConfigError for keys that do not fit.
std::shared_ptr<const StreamedImages> streamedImages(const DataConfig& config, ImageIndex index);

/// A split as the loop reads it: batches decoded for the loader's epoch and seed, float32
/// [B, 3, S, S] normalised and int64 labels; the loader's augmentation (data.rotate_degrees,
/// crop_padding, horizontal_flip: the training loader's) applied after the transform, with the
/// draws of the in-memory path (seed, epoch, sample index). With skipBadImages a bad image is logged, counted and
/// left out of its batch (which is one shorter); otherwise its DataError (naming the file) ends the
/// job.
SampleSource streamedSource(std::shared_ptr<const StreamedImages> images, bool train);

}  // namespace ddp::worker::data
