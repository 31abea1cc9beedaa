// ddp::GradScaler: torch.amp.GradScaler's arithmetic, its found-inf flag summed over the group.
#include "ddp/grad_scaler.h"

#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
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
#include "ddp/fused_optim.h"
#include "libddp/amp_kernels.h"
#include "libddp/torch_compat.h"

namespace ddp {
namespace {

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

at::Tensor GradScaler::checkAndUnscale(torch::optim::Optimizer& optimizer, const at::Tensor& invScale, bool allowFp16) {
  c10::NoGradGuard noGrad;
  // Gradients by device and dtype, one kernel call per group; one flag per device.
  std::vector<at::Tensor> grads;
  for (const auto& paramGroup : optimizer.param_groups()) {
    for (const auto& param : paramGroup.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.scalar_type() == at::kHalf && !allowFp16) {
        DDP_THROW(Error, "ddp::GradScaler: attempting to unscale float16 gradients; keep the parameters in float32 "
                  "(autocast runs the forward in float16, the master weights stay float32)");
      }
      grads.push_back(grad);
    }
  }
  internal::TensorsByDevice groups = internal::byDeviceAndDtype(grads, "ddp::GradScaler::unscale_");
  at::Tensor foundInf = at::full({}, 0.0, at::TensorOptions().dtype(at::kFloat).device(scale_.device()));
  for (auto& [device, byDtype] : groups) {
    at::Tensor deviceFlag = device == scale_.device() ? foundInf : at::full({}, 0.0, foundInf.options().device(device));
    const at::Tensor deviceInv = invScale.to(device);
    for (auto& [dtype, list] : byDtype) internal::nonFiniteCheckAndUnscale(list, deviceFlag, deviceInv);
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
  // PyTorch records one flag per device that held a gradient: none here, no inf check (step() and
  // update() then refuse, after the group's collective above).
  return grads.empty() ? at::Tensor() : foundInf;
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
  state.foundInf = checkAndUnscale(optimizer, scale_.to(at::kDouble).reciprocal().to(at::kFloat), /*allowFp16=*/false);
  state.stage = Stage::kUnscaled;
}

namespace {

bool holdsGradients(const torch::optim::Optimizer& optimizer) {
  for (const auto& paramGroup : optimizer.param_groups()) {
    for (const auto& param : paramGroup.params()) {
      if (param.grad().defined()) return true;
    }
  }
  return false;
}

// PyTorch's "No inf checks were recorded for this optimizer." (after the group's check, which is
// collective: every rank takes part before one throws).
void requireInfChecks(bool checked) {
  if (!checked) {
    DDP_THROW(Error, "ddp::GradScaler::step: no inf checks were recorded for this optimizer: none of its parameters "
              "has a gradient; call scale(loss).backward() before step()");
  }
}

}  // namespace

void GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return;
  }
  requireScale("step");
  PerOptimizer& state = perOptimizer_[&optimizer];
  if (state.stage == Stage::kStepped) DDP_THROW(Error, "ddp::GradScaler::step has already been called since the last update()");
  const bool checked = holdsGradients(optimizer);
  if (auto* fused = dynamic_cast<FusedOptimizer*>(&optimizer)) {
    // PyTorch's _step_supports_amp_scaling path: check without unscaling (× 1), and let the kernel
    // divide by the scale (unless unscale_() did) and skip on the flag.
    const bool unscaled = state.stage == Stage::kUnscaled;
    if (!unscaled) state.foundInf = checkAndUnscale(optimizer, at::ones({}, scale_.options()), /*allowFp16=*/true);
    requireInfChecks(checked);
    fused->fusedStep(unscaled ? at::Tensor() : scale_, state.foundInf, at::Tensor());
    state.stage = Stage::kStepped;
    return;
  }
  if (state.stage == Stage::kReady) unscale_(optimizer);
  requireInfChecks(checked);
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
