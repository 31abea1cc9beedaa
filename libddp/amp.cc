// ddp::Autocast and ddp::GradScaler: torch.autocast and torch.amp.GradScaler (torch/amp/grad_scaler.py)
// for LibTorch, the scaler's found-inf flag agreed on over the process group.
#include "ddp/amp.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "libddp/torch_compat_autocast.h"
#include "ddp/fused_optim.h"

namespace ddp {
namespace {

const char* dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "float32";
    default: return c10::toString(t);
  }
}

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

// _amp_update_scale_'s kernel (aten/src/ATen/native/cuda/AmpKernels.cu), written out where
// LibTorch has no kernel for the device (CPU in 1.13). The arithmetic is the kernel's: double
// products stored to float.
void updateScale(at::Tensor& scale, at::Tensor& growthTracker, const at::Tensor& foundInf, double growthFactor,
                 double backoffFactor, int64_t growthInterval) {
  if (scale.is_cuda() || compat::kAmpKernelsOnCpu) {
    at::_amp_update_scale_(scale, growthTracker, foundInf, growthFactor, backoffFactor, growthInterval);
    return;
  }
  const float current = scale.item<float>();
  if (foundInf.item<float>() != 0.0f) {
    scale.fill_(static_cast<float>(current * backoffFactor));
    growthTracker.fill_(0);
    return;
  }
  const int32_t successful = growthTracker.item<int32_t>() + 1;
  if (successful == growthInterval) {
    const auto grown = static_cast<float>(current * growthFactor);
    if (std::isfinite(grown)) scale.fill_(grown);
    growthTracker.fill_(0);
  } else {
    growthTracker.fill_(successful);
  }
}

}  // namespace

bool Autocast::supports(c10::DeviceType deviceType, at::ScalarType dtype) {
  if (deviceType == c10::DeviceType::CUDA) return dtype == at::kHalf || dtype == at::kBFloat16;
  if (deviceType == c10::DeviceType::CPU) return dtype == at::kBFloat16 || (dtype == at::kHalf && compat::kCpuAutocastHalf);
  return false;
}

Autocast::Autocast(c10::DeviceType deviceType, at::ScalarType dtype, bool enabled) : deviceType_(deviceType) {
  if (enabled && !supports(deviceType, dtype)) {
    DDP_THROW(ConfigError, "ddp::Autocast: this LibTorch cannot autocast ", c10::DeviceTypeName(deviceType), " to ",
              dtypeName(dtype), " (CUDA: float16 or bfloat16; CPU: bfloat16",
              compat::kCpuAutocastHalf ? " or float16" : "", ")");
  }
  previousEnabled_ = compat::autocastEnabled(deviceType);
  previousDtype_ = compat::autocastDtype(deviceType);
  compat::setAutocastEnabled(deviceType, enabled);
  if (enabled) compat::setAutocastDtype(deviceType, dtype);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // torch.autocast.__exit__: the cast-weight cache lives as long as the outermost autocast.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::setAutocastEnabled(deviceType_, previousEnabled_);
  compat::setAutocastDtype(deviceType_, previousDtype_);
}

GradScaler::GradScaler(GradScalerOptions options) : options_(options), initScale_(options.initScale) {
  if (!options_.enabled) return;
  if (!(options_.initScale > 0) || !std::isfinite(options_.initScale)) {
    DDP_THROW(ConfigError, "ddp::GradScaler: initScale must be a positive finite number (got ", options_.initScale, ")");
  }
  if (!(options_.growthFactor > 1.0)) {
    DDP_THROW(ConfigError, "ddp::GradScaler: growthFactor must be > 1.0 (got ", options_.growthFactor, ")");
  }
  if (!(options_.backoffFactor < 1.0) || !(options_.backoffFactor > 0.0)) {
    DDP_THROW(ConfigError, "ddp::GradScaler: backoffFactor must be in (0, 1) (got ", options_.backoffFactor, ")");
  }
  if (options_.growthInterval < 1) {
    DDP_THROW(ConfigError, "ddp::GradScaler: growthInterval must be >= 1 (got ", options_.growthInterval, ")");
  }
}

GradScaler::GradScaler(ProcessGroup group, GradScalerOptions options) : GradScaler(options) {
  group_.emplace(std::move(group));
}

void GradScaler::requireScale(const char* what) const {
  if (!scale_.defined()) {
    DDP_THROW(Error, "ddp::GradScaler::", what, " called before scale(): scale the loss first (scaler.scale(loss)"
              ".backward()), as torch.amp.GradScaler requires");
  }
}

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!options_.enabled) return outputs;
  if (!scale_.defined()) {
    const auto on = at::TensorOptions().device(outputs.device());
    scale_ = at::full({}, initScale_, on.dtype(at::kFloat));
    growthTracker_ = at::full({}, initGrowthTracker_, on.dtype(at::kInt));
  }
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

at::Tensor nonFiniteFlag(const std::vector<at::Tensor>& tensors) {
  c10::NoGradGuard noGrad;
  std::vector<std::pair<c10::Device, std::map<at::ScalarType, std::vector<at::Tensor>>>> groups;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!at::isFloatingType(t.scalar_type())) {
      DDP_THROW(Error, "ddp::nonFiniteFlag: a ", t.scalar_type(), " tensor has no NaN or infinity to find; pass "
                "floating-point tensors (gradients)");
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == t.device(); });
    if (it == groups.end()) it = groups.insert(groups.end(), {t.device(), {}});
    it->second[t.scalar_type()].push_back(t);
  }
  if (groups.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat));
  const at::TensorOptions flagOptions = at::TensorOptions().dtype(at::kFloat).device(groups.front().first);
  at::Tensor found = at::zeros({}, flagOptions);
  for (auto& [device, byDtype] : groups) {
    at::Tensor flag = device == found.device() ? found : at::zeros({}, flagOptions.device(device));
    const at::Tensor one = at::ones({}, flagOptions.device(device));
    for (auto& [dtype, list] : byDtype) nonFiniteCheckAndUnscale(list, flag, one);
    if (!flag.is_same(found)) found.add_(flag.to(found.device()));
  }
  return found.clamp_max_(1.0);
}

namespace {
constexpr int64_t kNonFiniteChunk = 256;
}  // namespace

at::Tensor NonFiniteSteps::check(const std::vector<at::Tensor>& tensors, int64_t step) {
  c10::NoGradGuard noGrad;
  std::vector<std::pair<c10::Device, std::map<at::ScalarType, std::vector<at::Tensor>>>> groups;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!at::isFloatingType(t.scalar_type())) {
      DDP_THROW(Error, "ddp::NonFiniteSteps::check: a ", t.scalar_type(), " tensor has no NaN or infinity to find; "
                "pass floating-point tensors (gradients)");
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == t.device(); });
    if (it == groups.end()) it = groups.insert(groups.end(), {t.device(), {}});
    it->second[t.scalar_type()].push_back(t);
  }
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
      for (auto& [dtype, list] : byDtype) nonFiniteCheckAndUnscale(list, slot, one->second);
    } else {  // another device's gradients: its own flag, added in
      at::Tensor flag = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(where));
      for (auto& [dtype, list] : byDtype) nonFiniteCheckAndUnscale(list, flag, one->second);
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

at::Tensor GradScaler::checkAndUnscale(torch::optim::Optimizer& optimizer, const at::Tensor& invScale) {
  c10::NoGradGuard noGrad;
  // Gradients by device and dtype, one kernel call per group; one flag per device.
  std::vector<std::pair<c10::Device, std::map<at::ScalarType, std::vector<at::Tensor>>>> groups;
  for (const auto& paramGroup : optimizer.param_groups()) {
    for (const auto& param : paramGroup.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.scalar_type() == at::kHalf) {
        DDP_THROW(Error, "ddp::GradScaler: attempting to unscale float16 gradients; keep the parameters in float32 "
                  "(autocast runs the forward in float16, the master weights stay float32)");
      }
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == grad.device(); });
      if (it == groups.end()) it = groups.insert(groups.end(), {grad.device(), {}});
      it->second[grad.scalar_type()].push_back(grad);
    }
  }
  at::Tensor foundInf = at::full({}, 0.0, at::TensorOptions().dtype(at::kFloat).device(scale_.device()));
  for (auto& [device, byDtype] : groups) {
    at::Tensor deviceFlag = device == scale_.device() ? foundInf : at::full({}, 0.0, foundInf.options().device(device));
    const at::Tensor deviceInv = invScale.to(device);
    for (auto& [dtype, grads] : byDtype) nonFiniteCheckAndUnscale(grads, deviceFlag, deviceInv);
    if (!deviceFlag.is_same(foundInf)) foundInf.add_(deviceFlag.to(foundInf.device()));
  }
  if (group_ && group_->size() > 1) {
    // After DDP's all-reduce the gradients agree, and so would the flags; summing them anyway keeps
    // the ranks in step even when they do not (a rank's own overflow in unscale, gradients outside DDP).
    at::Tensor flag = foundInf.to(group_->collectiveDevice());
    group_->allReduce(flag);
    foundInf.copy_(flag);
  }
  foundInf.clamp_max_(1.0);
  lastFoundInf_ = foundInf;
  return foundInf;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  requireScale("unscale_");
  PerOptimizer& state = perOptimizer_[&optimizer];
  if (state.stage == Stage::kUnscaled) {
    DDP_THROW(Error, "ddp::GradScaler::unscale_ has already been called on this optimizer since the last update()");
  }
  if (state.stage == Stage::kStepped) DDP_THROW(Error, "ddp::GradScaler::unscale_ is being called after step()");
  // In fp64 as PyTorch does: fp32 division can be imprecise under some compile options.
  state.foundInf = checkAndUnscale(optimizer, scale_.to(at::kDouble).reciprocal().to(at::kFloat));
  state.stage = Stage::kUnscaled;
}

void GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return;
  }
  requireScale("step");
  PerOptimizer& state = perOptimizer_[&optimizer];
  if (state.stage == Stage::kStepped) DDP_THROW(Error, "ddp::GradScaler::step has already been called since the last update()");
  if (auto* fused = dynamic_cast<FusedOptimizer*>(&optimizer)) {
    // PyTorch's _step_supports_amp_scaling path: check without unscaling (× 1), and let the kernel
    // divide by the scale (unless unscale_() did) and skip on the flag.
    const bool unscaled = state.stage == Stage::kUnscaled;
    if (!unscaled) state.foundInf = checkAndUnscale(optimizer, at::ones({}, scale_.options()));
    fused->fusedStep(unscaled ? at::Tensor() : scale_, state.foundInf, at::Tensor());
    state.stage = Stage::kStepped;
    return;
  }
  if (state.stage == Stage::kReady) unscale_(optimizer);
  if (state.foundInf.item<float>() == 0.0f) optimizer.step();
  state.stage = Stage::kStepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  requireScale("update");
  at::Tensor combined;
  for (auto& [optimizer, state] : perOptimizer_) {
    if (!state.foundInf.defined()) continue;
    if (!combined.defined()) combined = state.foundInf.to(scale_.device()).clone();
    else combined.add_(state.foundInf.to(scale_.device()));
  }
  if (!combined.defined()) {
    DDP_THROW(Error, "ddp::GradScaler::update: no inf checks were recorded; call step() (or unscale_()) first");
  }
  c10::NoGradGuard noGrad;
  updateScale(scale_, growthTracker_, combined, options_.growthFactor, options_.backoffFactor, options_.growthInterval);
  perOptimizer_.clear();
}

void GradScaler::update(double newScale) {
  if (!options_.enabled) return;
  requireScale("update");
  scale_.fill_(newScale);
  perOptimizer_.clear();
}

double GradScaler::getScale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : initScale_;
}

at::Tensor GradScaler::foundInf() const { return lastFoundInf_; }

std::optional<GradScalerState> GradScaler::stateDict() const {
  if (!options_.enabled) return std::nullopt;
  GradScalerState s;
  s.scale = getScale();
  s.growthFactor = options_.growthFactor;
  s.backoffFactor = options_.backoffFactor;
  s.growthInterval = options_.growthInterval;
  s.growthTracker = growthTracker_.defined() ? growthTracker_.item<int32_t>() : initGrowthTracker_;
  return s;
}

void GradScaler::loadStateDict(const GradScalerState& state) {
  if (!options_.enabled) return;
  initScale_ = state.scale;
  if (scale_.defined()) scale_.fill_(state.scale);
  options_.growthFactor = state.growthFactor;
  options_.backoffFactor = state.backoffFactor;
  options_.growthInterval = state.growthInterval;
  initGrowthTracker_ = state.growthTracker;
  if (growthTracker_.defined()) growthTracker_.fill_(state.growthTracker);
}

}  // namespace ddp
