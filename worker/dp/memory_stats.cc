#include "worker/dp/memory_stats.h"

#include <fstream>
#include <sstream>
#include <string>

#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace ddp::worker::dp {

int64_t peakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kib = 0;
      fields >> kib;  // "VmHWM:    123456 kB"
      return kib * 1024;
    }
  }
  return 0;
}

int64_t cudaPeakAllocatedBytes(c10::Device device) {
#ifdef DDP_WITH_CUDA
  if (!device.is_cuda()) return 0;
  // allocated_bytes[0] is the aggregate over pool kinds (StatType::AGGREGATE).
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[0].peak;
#else
  (void)device;
  return 0;
#endif
}

}  // namespace ddp::worker::dp
