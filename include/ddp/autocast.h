// ddp::Autocast: torch.autocast for LibTorch programs (a scoped guard per thread).
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace ddp {

/// `with torch.autocast(device_type, dtype, enabled)`: while it lives, this thread's eligible ops on
/// `deviceType` run in `dtype` (matmuls, convolutions) or fp32 (losses, reductions), as PyTorch's
/// autocast op lists say; parameters stay fp32. Restores the previous state (nesting works) and, as
/// PyTorch does, clears the cast-weight cache when the outermost one ends. Autocast is per thread.
/// CUDA: kHalf or kBFloat16; CPU: kBFloat16 (and kHalf where this LibTorch's CPU autocast has it,
/// 2.x). Anything else throws ConfigError. kCUDA in a process that sees no CUDA device does
/// nothing, and says so once (a warning, as torch.autocast("cuda") without CUDA).
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

}  // namespace ddp
