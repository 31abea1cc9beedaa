// ddp::nonFiniteFlag and ddp::NonFiniteSteps: the device-side checks for NaN and infinity.
#include "ddp/non_finite.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "libddp/amp_kernels.h"
#include "libddp/torch_compat.h"

namespace ddp {
namespace internal {

// _amp_foreach_non_finite_check_and_unscale_ where LibTorch has no kernel for the device (CPU in
// 1.13): the same operations, gradient by gradient (found_inf = 1 if any value is not finite; every
// gradient multiplied by inv_scale, in its own dtype, as the kernel does).
void nonFiniteCheckAndUnscale(std::vector<at::Tensor>& grads, at::Tensor& foundInf, const at::Tensor& invScale) {
  if (grads.empty()) return;
  if (grads.front().is_cuda() || compat::kAmpKernelsOnCpu) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, foundInf, invScale);
    return;
  }
  for (auto& g : grads) {
    if (!at::isfinite(g).all().item<bool>()) foundInf.fill_(1.0);
    g.mul_(invScale);
  }
}

TensorsByDevice byDeviceAndDtype(const std::vector<at::Tensor>& tensors, const char* who) {
  TensorsByDevice groups;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!at::isFloatingType(t.scalar_type())) {
      DDP_THROW(Error, who, ": a ", t.scalar_type(), " tensor has no NaN or infinity to find; pass floating-point "
                "tensors (gradients)");
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == t.device(); });
    if (it == groups.end()) it = groups.insert(groups.end(), {t.device(), {}});
    it->second[t.scalar_type()].push_back(t);
  }
  return groups;
}

}  // namespace internal

at::Tensor nonFiniteFlag(const std::vector<at::Tensor>& tensors) {
  c10::NoGradGuard noGrad;
  internal::TensorsByDevice groups = internal::byDeviceAndDtype(tensors, "ddp::nonFiniteFlag");
  if (groups.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat));
  const at::TensorOptions flagOptions = at::TensorOptions().dtype(at::kFloat).device(groups.front().first);
  at::Tensor found = at::zeros({}, flagOptions);
  for (auto& [device, byDtype] : groups) {
    at::Tensor flag = device == found.device() ? found : at::zeros({}, flagOptions.device(device));
    const at::Tensor one = at::ones({}, flagOptions.device(device));
    for (auto& [dtype, list] : byDtype) internal::nonFiniteCheckAndUnscale(list, flag, one);
    if (!flag.is_same(found)) found.add_(flag.to(found.device()));
  }
  return found.clamp_max_(1.0);
}

namespace {
constexpr int64_t kNonFiniteChunk = 256;
}  // namespace

at::Tensor NonFiniteSteps::check(const std::vector<at::Tensor>& tensors, int64_t step) {
  c10::NoGradGuard noGrad;
  internal::TensorsByDevice groups = internal::byDeviceAndDtype(tensors, "ddp::NonFiniteSteps::check");
  const c10::Device device = groups.empty() ? c10::Device(c10::kCPU) : groups.front().first;
  const int64_t used = static_cast<int64_t>(steps_.size());
  if (!chunks_.empty() && chunks_.front().device() != device) {
    DDP_THROW(Error, "ddp::NonFiniteSteps::check: the tensors moved from ", chunks_.front().device().str(), " to ",
              device.str(), " between reads; read() first");
  }
  if (used == static_cast<int64_t>(chunks_.size()) * kNonFiniteChunk) {
    chunks_.push_back(at::zeros({kNonFiniteChunk}, at::TensorOptions().dtype(at::kFloat).device(device)));
  }
  at::Tensor slot = chunks_[static_cast<std::size_t>(used / kNonFiniteChunk)].select(0, used % kNonFiniteChunk);
  steps_.push_back(step);
  for (auto& [where, byDtype] : groups) {
    auto one = std::find_if(ones_.begin(), ones_.end(), [&](const auto& o) { return o.first == where; });
    if (one == ones_.end()) {
      one = ones_.insert(ones_.end(), {where, at::ones({}, at::TensorOptions().dtype(at::kFloat).device(where))});
    }
    if (where == device) {
      for (auto& [dtype, list] : byDtype) internal::nonFiniteCheckAndUnscale(list, slot, one->second);
    } else {  // another device's gradients: its own flag, added in
      at::Tensor flag = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(where));
      for (auto& [dtype, list] : byDtype) internal::nonFiniteCheckAndUnscale(list, flag, one->second);
      slot.add_(flag.to(device));
    }
  }
  return slot;
}

NonFiniteSteps::Report NonFiniteSteps::read() {
  Report report;
  report.checked = static_cast<int64_t>(steps_.size());
  if (steps_.empty()) {
    report.inARow = inARow_;
    return report;
  }
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> used;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const int64_t n = std::min<int64_t>(kNonFiniteChunk, report.checked - static_cast<int64_t>(c) * kNonFiniteChunk);
    if (n > 0) used.push_back(chunks_[c].narrow(0, 0, n));
  }
  const at::Tensor flags = (used.size() == 1 ? used.front() : at::cat(used)).to(at::kCPU).contiguous();
  const float* f = flags.data_ptr<float>();
  for (int64_t i = 0; i < report.checked; ++i) {
    if (f[i] != 0.0f) {
      ++report.flagged;
      if (report.first == 0) report.first = steps_[static_cast<std::size_t>(i)];
      ++inARow_;
    } else {
      inARow_ = 0;
    }
  }
  report.inARow = inARow_;
  // The slots are reused from the first: zeroed behind the copy just read, in stream order.
  chunks_.resize(1);
  if (report.flagged > 0) chunks_.front().zero_();
  steps_.clear();
  return report;
}

}  // namespace ddp
