#include "libddp/runtime/startup_watchdog.h"

#include <cstdio>
#include <cstdlib>

namespace ddp::runtime {

StartupWatchdog::StartupWatchdog(std::chrono::milliseconds limit, std::function<std::string()> message,
                                 int exitCode) {
  thread_ = std::thread([this, limit, message = std::move(message), exitCode] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (changed_.wait_for(lock, limit, [this] { return disarmed_; })) return;
    const std::string line = "worker: " + message() + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
    std::_Exit(exitCode);  // the main thread is blocked inside LibTorch: no unwinding is possible
  });
}

void StartupWatchdog::disarm() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    disarmed_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

StartupWatchdog::~StartupWatchdog() { disarm(); }

}  // namespace ddp::runtime
