#include "worker/train/nonfinite_tracker.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <string>

#include "worker/train/finite_check.h"

namespace ddp::worker {

void NonFiniteTracker::recordInGraph(const at::Tensor& found, const at::Tensor& stepNumber) {
  c10::NoGradGuard noGrad;
  if (!counts_.defined()) counts_ = at::zeros({3}, found.options().dtype(at::kDouble));
  at::Tensor flagged = counts_.select(0, 0);
  counts_.select(0, 2).add_(flagged.eq(0).to(at::kDouble).mul_(found).mul_(stepNumber));
  flagged.add_(found);
  counts_.select(0, 1).add_(found).mul_(found);
}

void NonFiniteTracker::check(TrainResult& result, bool deviceSkips) {
  int64_t newlyFlagged = 0;
  int64_t inARow = 0;
  if (steps_.pending() > 0) {  // eager steps
    const NonFiniteSteps::Report report = steps_.read();
    newlyFlagged = report.flagged;
    inARow = report.inARow;
    if (first_ == 0) first_ = report.first;
  } else if (counts_.defined()) {  // graph steps
    const at::Tensor counts = counts_.to(at::kCPU);
    const auto flagged = static_cast<int64_t>(counts[0].item<double>());
    newlyFlagged = flagged - seen_;
    seen_ = flagged;
    inARow = static_cast<int64_t>(counts[1].item<double>());
    first_ = static_cast<int64_t>(counts[2].item<double>());
  }
  if (newlyFlagged == 0) return;
  const int64_t first = first_;
  if (!deviceSkips || !config_.train.skipNonfiniteSteps || inARow >= kMaxSkippedInARow) {
    throwDiverged(config_, nonFiniteGradients(config_.train.clipGradNorm) + " at step " + std::to_string(first) +
                               (deviceSkips ? std::string(", which was not applied")
                                            : std::string(" (the GPU's check is read at log steps; checkpoints "
                                                          "are only written from steps before it)")) +
                               (inARow > 1 ? ", " + std::to_string(inARow) + " steps in a row up to step " +
                                                 std::to_string(result.steps)
                                           : std::string()));
  }
  result.skippedSteps += newlyFlagged;
  if (rank_ == 0) {
    bar_.clear();
    spdlog::warn("{} step(s) up to step {} had a NaN or infinite gradient and were skipped "
                 "(train.skip_nonfinite_steps; the first of this run at step {})",
                 newlyFlagged, result.steps, first);
  }
}

}  // namespace ddp::worker
