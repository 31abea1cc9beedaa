// ddp::Autocast over LibTorch's autocast state (libddp/torch_compat_autocast.h: 1.13 and 2.x).
#include "ddp/autocast.h"

#include <ATen/autocast_mode.h>
#include <spdlog/spdlog.h>

#include <mutex>

#include "ddp/cuda.h"

#include "common/error.h"
#include "libddp/torch_compat_autocast.h"

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

bool processSeesCuda() {
  static const bool sees = cudaDeviceCount() > 0;
  return sees;
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
  // torch.autocast("cuda") without CUDA warns and disables itself; a loop that autocasts CUDA
  // while its model runs on the CPU would otherwise train in fp32 without a word. Asked once: an
  // Autocast is made every step, and the devices a process sees do not change.
  if (enabled && deviceType == c10::DeviceType::CUDA && !processSeesCuda()) {
    static std::once_flag said;
    std::call_once(said, [] {
      spdlog::warn("ddp::Autocast(kCUDA, ...): this process sees no CUDA device, so it does nothing (as "
                   "torch.autocast('cuda') without CUDA): the ops run in float32; autocast the device the model "
                   "is on (kCPU with kBFloat16)");
    });
    enabled = false;
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

}  // namespace ddp
