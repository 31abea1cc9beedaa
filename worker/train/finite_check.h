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

/// What a step's finiteness check reads: the gradients, and the norm train.clip_grad_norm took
/// before clipping (when defined). A norm that overflowed float32 while every gradient was finite
/// made clip_grad_norm_'s coefficient 0 and the gradients zeros, which pass as finite; the norm
/// makes that step a non-finite one (skipped with train.skip_nonfinite_steps, else the run stops).
std::vector<at::Tensor> checkedForFiniteness(const std::vector<at::Tensor>& params, const at::Tensor& gradNorm);

}  // namespace ddp::worker
