// A deadline for the worker's start-up (rendezvous and process-group creation). LibTorch's store
// client does not always honour its own timeout: a store that speaks another protocol version, or a
// peer that left half a request on the server, can hold a rank in a read forever. Past the deadline
// the watchdog prints one line and ends the process (as PyTorch's NCCL watchdog does with a hung
// collective): a blocked LibTorch call cannot be interrupted, and a hung worker holds the job.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ddp::runtime {

class StartupWatchdog {
 public:
  /// Armed at once: unless disarm() (or the destructor) runs within `limit`, writes
  /// "worker: " + message() to stderr and exits the process with `exitCode`.
  StartupWatchdog(std::chrono::milliseconds limit, std::function<std::string()> message, int exitCode = 1);
  ~StartupWatchdog();
  StartupWatchdog(const StartupWatchdog&) = delete;
  StartupWatchdog& operator=(const StartupWatchdog&) = delete;

  void disarm();

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool disarmed_ = false;
  std::thread thread_;
};

}  // namespace ddp::runtime
