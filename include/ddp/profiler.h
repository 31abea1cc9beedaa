// ddp::Profiler: torch.profiler.profile for LibTorch programs (Kineto): the ops a thread runs on
// the CPU and, on a GPU, the kernels and copies (CUPTI) between start() and stop(), written as the
// Chrome trace torch.profiler's export_chrome_trace writes (Perfetto, chrome://tracing and
// TensorBoard's profiler plugin read it).
//
//   ddp::Profiler profiler({/*cuda=*/true});
//   profiler.start();
//   for (int i = 0; i < 5; ++i) { const auto span = profiler.step(); ...train step... }
//   profiler.stop("trace_rank0.json");
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace ddp {

struct ProfilerOptions {
  bool cuda = false;           // also the GPU's kernels and copies (ProfilerActivity.CUDA)
  bool recordShapes = false;   // record_shapes
  bool withStack = false;      // with_stack
};

class Profiler {
 public:
  /// Whether this LibTorch can profile (LibTorch 2.x; 1.13's C++ profiler API differs).
  static bool available();

  explicit Profiler(ProfilerOptions options = {});
  ~Profiler();  // stops a running profile without writing it
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Starts recording on this thread (ConfigError where unavailable; Error if already running).
  void start();
  /// A "ProfilerStep#N" span around one step, as torch.profiler's step() marks them (N counts from
  /// 0 per profile); hold it for the step's duration (nothing is recorded when not running).
  std::unique_ptr<at::RecordFunction> step();
  /// Stops and writes the trace to `path`, whole or not at all (written beside it, then renamed).
  /// Returns the count of events recorded. On a GPU, Kineto waits for the device's activity.
  int64_t stop(const std::string& path);
  bool running() const { return running_; }

 private:
  ProfilerOptions options_;
  bool running_ = false;
  int64_t steps_ = 0;
};

}  // namespace ddp
