// Fashion-MNIST from the idx files of Debian's dataset-fashion-mnist package.
#pragma once

#include <string>

#include "worker/data/tensor_dataset.h"

namespace ddp::worker::data {

/// Where Debian's dataset-fashion-mnist installs the four gzipped idx files.
inline constexpr const char* kFashionMnistDefaultRoot = "/usr/share/datasets/fashion-mnist";

/// Per-channel statistics of the Fashion-MNIST training images scaled to [0, 1]
/// (mean 0.2860, std 0.3530, the values torchvision tutorials use). Images are
/// normalised as float32 ((x / 255) - mean) / std, exactly torchvision's
/// ToTensor() + Normalize((0.2860,), (0.3530,)), so a Python reference run with
/// those transforms sees bit-identical inputs.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr int64_t kFashionMnistClasses = 10;

enum class Split { kTrain, kTest };

/// Loads one split (60000 train or 10000 test images) from `root`, which holds
/// train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz
/// and t10k-labels-idx1-ubyte.gz, or the same names without .gz.
/// Returns images uint8 [N, 1, 28, 28] with mean/stddev set as above (gatherBatch makes
/// the normalised float32 model input), labels int64 [N].
/// Throws ddp::DataError naming the file and the fix when a file is missing,
/// corrupt, truncated, or the images and labels disagree.
TensorDataset loadFashionMnist(const std::string& root, Split split);

}  // namespace ddp::worker::data
