// Mixed precision for LibTorch programs: ddp::Autocast (torch.autocast) and ddp::GradScaler
// (torch.amp.GradScaler, which LibTorch lacks), the latter aware of the process group so that every
// rank skips the same steps and keeps the same scale.
//
//   ddp::GradScaler scaler(group);                        // fp16: init scale 2^16, growth 2, backoff 0.5
//   for (batch ...) {
//     optimizer.zero_grad();
//     at::Tensor loss;
//     { ddp::Autocast autocast(group.device().type(), at::kHalf);  // forward and loss only
//       loss = criterion(model.forward(x), y); }
//     scaler.scale(loss).backward();                     // DDP averages the scaled gradients
//     scaler.unscale_(optimizer);                        // optional: before clipping
//     ddp::clipGradNorm(params, 1.0);
//     scaler.step(optimizer);                            // skipped when a gradient overflowed
//     scaler.update();
//   }
//
// bf16 needs no scaler: ddp::Autocast(device_type, at::kBFloat16) around the forward is all.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "ddp/process_group.h"

namespace torch::optim {
class Optimizer;
}

namespace ddp {

/// `with torch.autocast(device_type, dtype, enabled)`: while it lives, this thread's eligible ops on
/// `deviceType` run in `dtype` (matmuls, convolutions) or fp32 (losses, reductions), as PyTorch's
/// autocast op lists say; parameters stay fp32. Restores the previous state (nesting works) and, as
/// PyTorch does, clears the cast-weight cache when the outermost one ends. Autocast is per thread.
/// CUDA: kHalf or kBFloat16; CPU: kBFloat16 (and kHalf where this LibTorch's CPU autocast has it,
/// 2.x). Anything else throws ConfigError.
class Autocast {
 public:
  Autocast(c10::DeviceType deviceType, at::ScalarType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

  /// Whether this LibTorch can autocast `deviceType` to `dtype`.
  static bool supports(c10::DeviceType deviceType, at::ScalarType dtype);

 private:
  c10::DeviceType deviceType_;
  bool previousEnabled_;
  at::ScalarType previousDtype_;
};

/// 1 if any defined tensor of `tensors` holds a NaN or an infinity, else 0: a float32 0-dim tensor
/// on the first defined tensor's device, computed there by LibTorch's
/// _amp_foreach_non_finite_check_and_unscale_ (scale 1, one call per device and dtype, as the
/// GradScaler checks gradients): on a GPU nothing waits for the device. Read it when you log, or
/// hand it to ddp::FusedOptimizer::fusedStep as its found-inf flag to skip such a step on the device.
/// Floating-point tensors only (ddp::Error otherwise); none defined: a CPU zero.
at::Tensor nonFiniteFlag(const std::vector<at::Tensor>& tensors);

/// The non-finite check of a training loop that must not wait for its GPU between log steps, for
/// the price of one kernel per step: each step's gradients are checked into a slot of a device
/// buffer made zero beforehand (no host read, no zeroing, no bookkeeping kernels per step), and the
/// slot is the step's found-inf flag for ddp::FusedOptimizer::fusedStep. read() copies the flags of
/// the steps checked since the last read to the host at once (that waits for the device) and tells
/// which were flagged. Not thread-safe; the flags' storage grows by 256 steps at a time between reads.
///
///   ddp::NonFiniteSteps checks;
///   ... backward ...
///   optimizer.fusedStep({}, checks.check(grads, step), {});     // skipped on the device if flagged
///   if (logging) { auto r = checks.read(); if (r.flagged) ... }  // the only wait
class NonFiniteSteps {
 public:
  /// What read() found over the steps checked since the previous read.
  struct Report {
    int64_t checked = 0;  // steps checked
    int64_t flagged = 0;  // of them with a NaN or an infinity
    int64_t first = 0;    // the first flagged one's step number (0: none)
    int64_t inARow = 0;   // flagged steps in a row up to the last one checked, across reads (0: it was finite)
  };

  /// Checks `tensors` (floating point, undefined ones skipped; ddp::Error otherwise) as step `step`
  /// and returns its flag: a float32 0-dim tensor on the first defined tensor's device, nonzero if a
  /// value is NaN or infinite. The flag stays valid until the next read().
  at::Tensor check(const std::vector<at::Tensor>& tensors, int64_t step);
  /// The steps checked since the last read (waits for the device); their slots are then reused.
  Report read();
  /// Steps checked and not yet read.
  int64_t pending() const { return static_cast<int64_t>(steps_.size()); }

 private:
  std::vector<at::Tensor> chunks_;  // kChunk zeroed float32 slots each, on the device
  std::vector<int64_t> steps_;      // the step number of each used slot
  std::vector<std::pair<c10::Device, at::Tensor>> ones_;  // the unscale factor 1, per device
  int64_t inARow_ = 0;
};

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
  /// waits for the device. Any other optimizer: unscale_() if not done yet, then the host reads the
  /// flag to decide (a wait on a GPU, as in PyTorch).
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
  at::Tensor checkAndUnscale(torch::optim::Optimizer& optimizer, const at::Tensor& invScale);

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
