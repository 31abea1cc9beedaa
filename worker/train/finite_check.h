// Divergence detection: a non-finite gradient stops training before it reaches the weights.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
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

/// What such a step had, for its line: "a gradient is NaN or infinite", or with a clipping norm
/// "a gradient or their norm (train.clip_grad_norm) is NaN or infinite".
std::string nonFiniteGradients(double clipGradNorm);

}  // namespace ddp::worker
