#include "worker/report/memory_stats.h"

#include <fstream>
#include <sstream>
#include <string>

#include "comm/cuda_plugin.h"

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
  if (!device.is_cuda() || !comm::cudaPluginBuilt()) return 0;
  return comm::loadCudaPlugin().peakAllocatedBytes(device.index());
}

}  // namespace ddp::worker::dp
