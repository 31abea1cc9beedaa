// The in-memory dataset every loader produces and the training loop consumes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ddp::worker::data {

/// A whole dataset held as two tensors whose first dimension is the sample index.
///
/// Images are kept as the loader found them: uint8 pixels for image files (a quarter
/// of float32's memory, and what one shared copy per host holds), with `mean` and
/// `stddev` per channel; the model sees float32 ((x / 255) - mean[c]) / stddev[c],
/// made per batch by gatherBatch()/sliceBatch() (torchvision's ToTensor + Normalize,
/// bit for bit). Data that is already model input (synthetic) is float32 with both
/// vectors empty.
struct TensorDataset {
  at::Tensor images;  // uint8 [N, C, H, W] with mean/stddev, or float32 [N, ...] model input
  at::Tensor labels;  // int64 [N], class ids in [0, numClasses)
  std::vector<float> mean;    // per channel; empty: images are model input as they are
  std::vector<float> stddev;  // per channel, same length as mean

  /// Number of samples N (0 for a default-constructed dataset).
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }

  /// Samples [begin, begin + count) as a dataset sharing this one's storage.
  TensorDataset rows(int64_t begin, int64_t count) const {
    return TensorDataset{images.narrow(0, begin, count), labels.narrow(0, begin, count), mean, stddev};
  }
};

}  // namespace ddp::worker::data
