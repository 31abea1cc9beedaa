// The library's differences between the two LibTorch builds we support: LibTorch 2.x (the pinned
// PyPI wheel, the default) and Debian's 1.13. Private to libddp/: the worker, which uses only the
// public headers, keeps its two (an autograd node's holder, the CPU AMP kernels) where it uses them.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#define DDP_TORCH_2 (TORCH_VERSION_MAJOR >= 2)

namespace ddp::compat {

/// The key torch::optim keeps per-parameter state under: the TensorImpl
/// address, as `void*` in 2.x and as its decimal string in 1.13.
#if DDP_TORCH_2
using OptimizerStateKey = void*;
inline OptimizerStateKey optimizerStateKey(const at::Tensor& param) { return param.unsafeGetTensorImpl(); }
#else
using OptimizerStateKey = std::string;
inline OptimizerStateKey optimizerStateKey(const at::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}
#endif

/// A leaf's AccumulateGrad node: intrusive_ptr in 2.x, shared_ptr in 1.13.
using GradAccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

/// A new autograd Node, held the way this LibTorch holds nodes: shared_ptr up
/// to 2.11 (checked on 1.13 and 2.11), intrusive_ptr in later 2.x (2.15).
template <typename NodeT, typename... Args>
auto makeNode(Args&&... args) {
  if constexpr (std::is_same_v<GradAccumulatorPtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::shared_ptr<NodeT>(new NodeT(std::forward<Args>(args)...));
  } else {
    return c10::make_intrusive<NodeT>(std::forward<Args>(args)...);
  }
}

/// Gloo sums bfloat16 in 2.x (checked on 2.15); 1.13's Gloo cannot.
constexpr bool kGlooSumsBFloat16 = DDP_TORCH_2;

// Autocast's API differs too: libddp/torch_compat_autocast.h (apart: its header is heavy).

/// CPU autocast to fp16 (2.x; 1.13's CPU autocast is bf16 only).
constexpr bool kCpuAutocastHalf = DDP_TORCH_2;
/// The GradScaler kernels (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_) have CPU
/// implementations in 2.x; 1.13 has CUDA ones only.
constexpr bool kAmpKernelsOnCpu = DDP_TORCH_2;

}  // namespace ddp::compat
