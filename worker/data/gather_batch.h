// Assembling a mini-batch from a dataset held in memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "worker/data/tensor_dataset.h"

namespace ddp::worker::data {

/// Rows `indices` of `t` along dim 0, in that order, as a new contiguous tensor.
/// Throws ddp::DataError naming the first index outside [0, t.size(0)).
at::Tensor gatherBatch(const at::Tensor& t, const std::vector<int64_t>& indices);

/// One mini-batch: model input (float32) and labels of the same samples.
struct Batch {
  at::Tensor images;
  at::Tensor labels;
};

/// Samples `indices` of `dataset`, images normalised into model input (see TensorDataset).
Batch gatherBatch(const TensorDataset& dataset, const std::vector<int64_t>& indices);

/// Samples [begin, begin + count) of `dataset`, images normalised into model input.
Batch sliceBatch(const TensorDataset& dataset, int64_t begin, int64_t count);

/// `rows` (images of `dataset`, any number of samples) as model input: for uint8 images
/// a new float32 tensor ((x / 255) - mean[c]) / stddev[c] computed in float32 in that
/// order (torchvision's ToTensor + Normalize, bit for bit); float images as they are.
at::Tensor modelInput(const TensorDataset& dataset, const at::Tensor& rows);

}  // namespace ddp::worker::data
