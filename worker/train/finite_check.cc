#include "worker/train/finite_check.h"

#include <ATen/ops/isfinite.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <c10/core/GradMode.h>

namespace ddp::worker {

bool allFinite(const std::vector<at::Tensor>& tensors) {
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> sums;
  sums.reserve(tensors.size());
  // NaN and Inf survive a sum (Inf - Inf is NaN); a double accumulator cannot overflow on finite fp32 values.
  for (const at::Tensor& t : tensors) {
    if (t.defined()) sums.push_back(t.sum(at::kDouble));
  }
  if (sums.empty()) return true;
  return at::isfinite(at::stack(sums)).all().item<bool>();
}

std::vector<at::Tensor> gradientsOf(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

}  // namespace ddp::worker
