// The in-memory dataset every loader produces and the training loop consumes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ddp::data {

/// A whole dataset held as two tensors whose first dimension is the sample index.
struct TensorDataset {
  at::Tensor images;  // float32 [N, C, H, W], already normalised
  at::Tensor labels;  // int64 [N], class ids in [0, numClasses)

  /// Number of samples N (0 for a default-constructed dataset).
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

}  // namespace ddp::data
