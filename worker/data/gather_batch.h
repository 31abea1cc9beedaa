// Assembling a mini-batch from a dataset held in memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "worker/data/tensor_dataset.h"

namespace ddp::data {

/// Rows `indices` of `t` along dim 0, in that order, as a new contiguous tensor.
/// Throws ddp::DataError naming the first index outside [0, t.size(0)).
at::Tensor gatherBatch(const at::Tensor& t, const std::vector<int64_t>& indices);

/// One mini-batch: images and labels of the same samples.
struct Batch {
  at::Tensor images;
  at::Tensor labels;
};

/// gatherBatch() on both tensors of `dataset`.
Batch gatherBatch(const TensorDataset& dataset, const std::vector<int64_t>& indices);

}  // namespace ddp::data
