// Data sets saved by Python: torch.save({"x": Tensor[N, ...], "y": Tensor[N]}, path).
#pragma once

#include <string>

#include "worker/data/tensor_dataset.h"

namespace ddp::worker::data {

/// Reads one split written by Python's torch.save({"x": x, "y": y}, path) (a plain or ordered
/// dict; other keys are ignored). x: [N, C, H, W], [N, H, W] (one channel) or [N, F] (kept as
/// [N, 1, 1, F]); float16/bfloat16/float32/float64 become float32 model input as they are, uint8
/// stays uint8 and becomes x / 255 per batch (torchvision's ToTensor scaling: mean 0, std 1 per
/// channel). y: any integer type, class ids >= 0, widened to int64. Throws ddp::DataError, naming
/// `key` (e.g. data.train_file) and the path, when the file is missing or not such a dict, or when x
/// and y disagree in length, y is not 1-D integers, or a label is negative.
TensorDataset loadTensorFile(const std::string& path, const std::string& key);

}  // namespace ddp::worker::data
