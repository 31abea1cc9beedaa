// ddp::GradScaler: torch.amp.GradScaler (which LibTorch lacks), aware of the process group so that
// every rank skips the same steps and keeps the same scale. The loop it goes in: <ddp/amp.h>.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>

#include "ddp/process_group.h"

namespace torch::optim {
class Optimizer;
}

namespace ddp {

/// torch.amp.GradScaler's constructor arguments, with its defaults.
struct GradScalerOptions {
  double initScale = 65536.0;  // 2^16
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  bool enabled = true;  // false: scale() is the identity, step() is optimizer.step(), update() nothing
};

/// The scaler's state as Python's GradScaler.state_dict() names it.
struct GradScalerState {
  double scale = 65536.0;
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  int64_t growthTracker = 0;  // "_growth_tracker": finite steps since the scale last changed
};

/// torch.amp.GradScaler for fp16 training, same arithmetic (LibTorch's
/// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ kernels; on a LibTorch without
/// their CPU kernels, 1.13, the same operations written out), same call order and the same errors
/// on misuse (ddp::Error). With a process group, the found-inf flag of unscale_() is summed over
/// the group after DDP's gradient all-reduce, on the device: every rank skips the same steps and
/// its scale stays equal to every other rank's. The scale lives on the device of the first loss
/// passed to scale().
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  explicit GradScaler(ProcessGroup group, GradScalerOptions options = {});

  /// outputs * scale (the scale created on outputs' device at the first call).
  at::Tensor scale(const at::Tensor& outputs);
  /// Divides the optimizer's gradients by the scale in place and records whether any is NaN or
  /// infinite (on every rank, with a group). At most once per optimizer between update()s, before
  /// step(). Throws Error on fp16 gradients (PyTorch: "Attempting to unscale FP16 gradients").
  void unscale_(torch::optim::Optimizer& optimizer);
  /// optimizer.step() unless a gradient was not finite (every rank alike). For a
  /// ddp::FusedOptimizer (ddp::FusedAdamW, ddp::FusedSGD), as PyTorch does for its fused
  /// optimizers, the kernel takes the scale (unless unscale_() ran) and the found-inf flag: nothing
  /// waits for the device; its float16 parameters' gradients are checked there too (PyTorch's
  /// allow_fp16 for fused optimizers), where unscale_() refuses them. Any other optimizer: unscale_()
  /// if not done yet, then the host reads the flag to decide (a wait on a GPU, as in PyTorch).
  /// Throws Error when none of the optimizer's parameters has a gradient ("no inf checks were
  /// recorded"), and update() then too unless another optimizer recorded one.
  void step(torch::optim::Optimizer& optimizer);
  /// The new scale: backoff × scale after a skipped step; growth × scale after growthInterval
  /// finite steps in a row (if still finite). Call once per iteration, after step().
  void update();
  /// Sets the scale to `newScale` (growth tracker unchanged), as update(new_scale=...).
  void update(double newScale);

  /// The current scale (the initial one before the first scale()); 1.0 when disabled.
  double getScale() const;
  /// 1 if the last unscale_()/step() found a NaN or infinite gradient (the step was skipped), else
  /// 0, as a float tensor on the scale's device (undefined before the first one). Read it when you
  /// log: item() waits for the device.
  at::Tensor foundInf() const;
  bool isEnabled() const { return options_.enabled; }

  /// Python's state_dict() / load_state_dict(); an empty optional when disabled.
  std::optional<GradScalerState> stateDict() const;
  void loadStateDict(const GradScalerState& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    at::Tensor foundInf;
  };
  void requireScale(const char* what) const;
  // The optimizer's gradients multiplied by invScale (1: only checked), and the found-inf flag
  // summed over the group.
  /// Undefined (no inf check recorded) when the optimizer holds no gradient on this rank.
  at::Tensor checkAndUnscale(torch::optim::Optimizer& optimizer, const at::Tensor& invScale, bool allowFp16);

  GradScalerOptions options_;
  std::optional<ProcessGroup> group_;
  double initScale_;
  int64_t initGrowthTracker_ = 0;
  at::Tensor scale_;          // float32, 0-dim, on the device
  at::Tensor growthTracker_;  // int32, same device
  at::Tensor lastFoundInf_;
  std::map<const torch::optim::Optimizer*, PerOptimizer> perOptimizer_;
};

}  // namespace ddp
