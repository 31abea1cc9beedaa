// One optimizer step, as a strategy the loop calls: eager (worker/train/eager_step.h: micro-
// batches, autocast, the fp16 loss scale, the non-finite check) or a CUDA graph (graph_step.h:
// captured once, replayed). What a step works on and leaves for the loop's records is StepState.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/grad_scaler.h"
#include "ddp/fused_optim.h"
#include "ddp/lr_schedule.h"
#include "worker/config/config.h"
#include "worker/data/batch_loader.h"
#include "worker/report/progress.h"
#include "worker/train/nonfinite_tracker.h"
#include "worker/train/parallelism.h"
#include "worker/train/sample_log.h"
#include "worker/train/sync_debug.h"
#include "worker/train/trainer.h"

namespace ddp::worker {

/// Where a step sits in its epoch: its micro-batch slots [first, first + count) of `batches`.
struct StepPlace {
  int64_t epoch = 0;
  std::size_t first = 0;
  std::size_t count = 0;
  std::size_t batches = 0;  // slots in the epoch (rank 0's batches: it holds the most)
  bool epochEnded() const { return first + count >= batches; }
};

/// The run's state a step works on (owned by the loop) and what it leaves for the records.
struct StepState {
  const WorkerConfig& config;
  Parallelism& parallelism;
  const std::vector<at::Tensor>& params;
  torch::optim::Optimizer& optimizer;
  LrSchedule& schedule;
  GradScaler* scaler;            // train.precision fp16, else null
  FusedOptimizer* fused;         // the optimizer when it skips a flagged step in its kernel, else null
  c10::Device device;
  at::ScalarType autocastDtype;  // kFloat: fp32, no autocast
  bool join;                     // train.uneven_inputs join (world > 1)
  int rank;
  TrainResult& result;           // result.steps: the steps done (the next step's index)
  NonFiniteTracker& nonfinite;
  SyncDebug& syncDebug;
  SampleLog* sampleLog;          // output.sample_log, else null
  ProgressBar& bar;              // cleared before a line of rank 0's
  // Left by the step:
  at::Tensor lossForLog;         // this rank's loss of the step (join: per sample), on the loss device
  at::Tensor gradNorm;           // before clipping (train.clip_grad_norm), else undefined
  double lr = 0;                 // the step's learning rate
};

class TrainStep {
 public:
  virtual ~TrainStep() = default;
  /// Runs the step of `place` on `batches` (this rank's, as `loader` makes them); returns the
  /// samples this rank consumed.
  virtual int64_t run(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader,
                      const StepPlace& place) = 0;
  /// Before the loop reads a result: until the device has done the steps run so far (graph
  /// replays, which no process-group work tracks).
  virtual void await() {}
  /// At log steps and the end: reads what the steps counted on the device (fp16's skipped steps)
  /// and stops a diverged run.
  virtual void checkCounters() {}
  /// After the last step: rank 0's line on how the steps ran, if any.
  virtual void report() const {}
};

}  // namespace ddp::worker
