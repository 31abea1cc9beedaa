// Finding NaN and infinite gradients on the device, without waiting for it: ddp::nonFiniteFlag for
// one check, ddp::NonFiniteSteps for a loop that reads its flags at log steps only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ddp {

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

}  // namespace ddp
