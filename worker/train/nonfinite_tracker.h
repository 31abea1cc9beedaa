// NaN and infinite gradients of steps whose check stays on the GPU (nothing between log steps
// reads the device): eager steps flag themselves through ddp::NonFiniteSteps, graph steps add to
// counts on the device inside the graph; the loop reads them at log steps, before a checkpoint and
// at the end, where a flagged step fails the run or, skipped by a fused optimizer under
// train.skip_nonfinite_steps, is counted and reported.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ddp/non_finite.h"
#include "worker/config/config.h"
#include "worker/report/progress.h"
#include "worker/train/trainer.h"

namespace ddp::worker {

class NonFiniteTracker {
 public:
  NonFiniteTracker(const WorkerConfig& config, int rank, ProgressBar& bar) : config_(config), rank_(rank), bar_(bar) {}

  /// An eager step's flag (1: a gradient is not finite), kept on the device for check().
  at::Tensor flagStep(const std::vector<at::Tensor>& grads, int64_t step) { return steps_.check(grads, step); }
  /// Inside a graph: adds `found` (this step's flag) to the device counts; `stepNumber` is the
  /// step's number as a device tensor.
  void recordInGraph(const at::Tensor& found, const at::Tensor& stepNumber);
  /// Reads the flags since the last check (after the group's collectives are in). A flagged step
  /// fails the run (throwDiverged) unless `deviceSkips` (the optimizer skipped it in its kernel),
  /// train.skip_nonfinite_steps and fewer than kMaxSkippedInARow in a row; else it is added to
  /// result.skippedSteps with a warning from rank 0.
  void check(TrainResult& result, bool deviceSkips);

 private:
  const WorkerConfig& config_;
  const int rank_;
  ProgressBar& bar_;
  NonFiniteSteps steps_;   // eager: one flag per step, read at check()
  at::Tensor counts_;      // graph: [flagged steps, of them in a row, the first one's number]
  int64_t seen_ = 0;       // graph: flagged steps already reported
  int64_t first_ = 0;      // the run's first flagged step (0: none yet)
};

}  // namespace ddp::worker
