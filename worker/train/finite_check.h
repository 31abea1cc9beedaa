// Divergence detection: a non-finite gradient stops training before it reaches the weights.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace ddp::worker {

/// True when every defined tensor in `tensors` is finite (no NaN, no Inf). Costs one read of
/// each (a double-precision sum per tensor) and one host sync.
bool allFinite(const std::vector<at::Tensor>& tensors);

/// The .grad of each parameter that has one.
std::vector<at::Tensor> gradientsOf(const std::vector<at::Tensor>& params);

}  // namespace ddp::worker
