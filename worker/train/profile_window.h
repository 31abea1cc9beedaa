// output.profile_start / profile_steps: the profiler (ddp::Profiler, torch.profiler's) around a
// window of steps, each step one "ProfilerStep#N" span, one Chrome trace per rank at its end.
#pragma once

#include <ATen/record_function.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ddp/profiler.h"
#include "worker/config/config.h"
#include "worker/report/progress.h"
#include "worker/train/sync_debug.h"

namespace ddp::worker {

class ProfileWindow {
 public:
  /// Off when output.profile_start is 0; ConfigError when this LibTorch has no profiler (1.13).
  ProfileWindow(const WorkerConfig& config, c10::Device device, int rank, SyncDebug& syncDebug, ProgressBar& bar);
  /// Before step `step` (counted from 1): starts the window at output.profile_start; the step's
  /// span to hold while it runs (null outside the window).
  std::unique_ptr<at::RecordFunction> beginStep(int64_t step);
  /// After step `step` and its records: ends the window after output.profile_steps steps.
  void endStep(int64_t step);
  /// The run ended (`lastStep` the last step done): ends a window still open.
  void finish(int64_t lastStep);

 private:
  void stop(int64_t lastStep);

  const WorkerConfig& config_;
  const int rank_;
  SyncDebug& syncDebug_;
  ProgressBar& bar_;
  std::optional<Profiler> profiler_;
  int64_t from_ = 0;  // the window's first step
};

}  // namespace ddp::worker
