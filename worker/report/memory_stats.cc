#include "worker/report/memory_stats.h"

#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace ddp::worker::dp
