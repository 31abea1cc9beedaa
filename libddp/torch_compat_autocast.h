// torch_compat.h's autocast part, apart because ATen/autocast_mode.h pulls in all of ATen's
// operators: include it only where autocast is switched (libddp/autocast.cc).
#pragma once

#include <ATen/autocast_mode.h>

#include "libddp/torch_compat.h"

namespace ddp::compat {
/// Autocast's per-thread switch and dtype for one device type: one call per device type in 2.x,
/// separate CPU/GPU functions in 1.13 (which autocasts CPU and CUDA only).
#if DDP_TORCH_2
inline bool autocastEnabled(c10::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
inline void setAutocastEnabled(c10::DeviceType t, bool on) { at::autocast::set_autocast_enabled(t, on); }
inline at::ScalarType autocastDtype(c10::DeviceType t) { return at::autocast::get_autocast_dtype(t); }
inline void setAutocastDtype(c10::DeviceType t, at::ScalarType d) { at::autocast::set_autocast_dtype(t, d); }
#else
inline bool autocastEnabled(c10::DeviceType t) {
  return t == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void setAutocastEnabled(c10::DeviceType t, bool on) {
  if (t == c10::DeviceType::CPU) at::autocast::set_cpu_enabled(on);
  else at::autocast::set_enabled(on);
}
inline at::ScalarType autocastDtype(c10::DeviceType t) {
  return t == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
inline void setAutocastDtype(c10::DeviceType t, at::ScalarType d) {
  if (t == c10::DeviceType::CPU) at::autocast::set_autocast_cpu_dtype(d);
  else at::autocast::set_autocast_gpu_dtype(d);
}
#endif


}  // namespace ddp::compat
