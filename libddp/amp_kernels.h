// LibTorch's _amp_foreach_non_finite_check_and_unscale_, written out where this LibTorch has no
// kernel for the device (CPU in 1.13). Shared by the non-finite checks and the GradScaler. Not installed.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <utility>
#include <vector>

namespace ddp::internal {

/// found_inf = 1 if any value of `grads` is not finite; every gradient multiplied by invScale, in
/// its own dtype, as the kernel does. One device and dtype per call.
void nonFiniteCheckAndUnscale(std::vector<at::Tensor>& grads, at::Tensor& foundInf, const at::Tensor& invScale);

/// Tensors by device (first seen first) and dtype: one kernel call per group. Undefined ones are
/// skipped; a tensor that is not floating point throws ddp::Error naming `who`.
using TensorsByDevice = std::vector<std::pair<c10::Device, std::map<at::ScalarType, std::vector<at::Tensor>>>>;
TensorsByDevice byDeviceAndDtype(const std::vector<at::Tensor>& tensors, const char* who);

}  // namespace ddp::internal
