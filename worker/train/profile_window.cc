#include "worker/train/profile_window.h"

#include <spdlog/spdlog.h>

#include <string>

#include "common/error.h"
#include "ddp/files.h"

namespace ddp::worker {

ProfileWindow::ProfileWindow(const WorkerConfig& config, c10::Device device, int rank, SyncDebug& syncDebug,
                             ProgressBar& bar)
    : config_(config), rank_(rank), syncDebug_(syncDebug), bar_(bar) {
  if (config.output.profileStart <= 0) return;
  if (!Profiler::available()) {
    DDP_THROW(ConfigError, "config: 'output.profile_start' needs LibTorch 2.x (1.13's C++ profiler API differs); "
              "set it 0, or profile with perf");
  }
  profiler_.emplace(ProfilerOptions{/*cuda=*/device.is_cuda()});
}

std::unique_ptr<at::RecordFunction> ProfileWindow::beginStep(int64_t step) {
  if (!profiler_) return nullptr;
  if (!profiler_->running() && step == config_.output.profileStart) {
    profiler_->start();
    from_ = step;
  }
  return profiler_->running() ? profiler_->step() : nullptr;
}

void ProfileWindow::endStep(int64_t step) {
  if (profiler_ && profiler_->running() && step + 1 >= from_ + config_.output.profileSteps) stop(step);
}

void ProfileWindow::finish(int64_t lastStep) {
  if (profiler_ && profiler_->running()) stop(lastStep);
}

// Kineto waits for the GPU's activity records: sync-debug is off meanwhile.
void ProfileWindow::stop(int64_t lastStep) {
  const SyncDebug::Paused paused(syncDebug_);
  makeDirectories(config_.output.dir, "output.dir");
  const std::string path = config_.output.dir + "/profile_rank" + std::to_string(rank_) + ".json";
  const int64_t events = profiler_->stop(path);
  if (rank_ == 0) {
    bar_.clear();
    spdlog::info("output.profile_start: steps {}..{} profiled ({} events on rank 0), one Chrome trace per rank: {} "
                 "(Perfetto, chrome://tracing)", from_, lastStep, events, path);
  }
}

}  // namespace ddp::worker
