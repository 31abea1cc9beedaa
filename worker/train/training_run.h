// The training loop's one run (runTrainingLoop): what the steps share, shared by the files that
// define its parts (training_loop.cc: the plan, the epochs, checkpoints; training_records.cc: the
// records of each step, the stop agreement, the end).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/ddp.h"
#include "worker/report/progress.h"
#include "worker/report/tensorboard/event_writer.h"
#include "worker/train/lm_records.h"
#include "worker/train/metrics.h"
#include "worker/train/nonfinite_tracker.h"
#include "worker/train/profile_window.h"
#include "worker/train/sample_log.h"
#include "worker/train/sync_debug.h"
#include "worker/train/train_order.h"
#include "worker/train/train_step.h"
#include "worker/train/training_checkpointer.h"
#include "worker/train/training_loop.h"

namespace ddp::worker::loop {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The most steps between the all-reduces that agree on a stop request (SIGTERM): the reaction
// time is up to this many steps, the cost one 8-byte collective per period. Fewer where steps are
// slow: the period is chosen (by every rank alike, from the ranks' mean step time the collective
// carries) to be about kStopReactionS, so that a stop checkpoints well within the launcher's
// SIGKILL grace (5 s by default). On a GPU the request rides on the log steps' loss all-reduce
// instead (no host read between log steps).
constexpr int64_t kStopCheckEvery = 10;
constexpr double kStopReactionS = 1.0;

// One run of the loop: what the steps share, the epochs, and after each step its records.
class TrainingRun {
 public:
  TrainingRun(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism, c10::Device device);
  TrainResult run();

 private:
  void checkPrecision() const;
  void checkCudaSettings() const;
  void planSteps();
  void openRecords();
  void keepRecords();
  void openRankZeroRecords(bool appendMetrics);
  void runEpoch(int64_t epoch);
  TrainPosition positionAfter(const StepPlace& place) const;
  void saveIfDue(const TrainPosition& position, bool epochEnded);
  void record(const StepPlace& place, bool last);
  void recordValidation();
  void countSkippedImages();
  bool stopRequested(const TrainPosition& position);
  bool outputsInPlace();
  void finish();
  int64_t resumedStart();
  int64_t epochBatchesFrom(int64_t epoch, int64_t start);
  int64_t microSteps() const;
  ProgressPoint progressAt(const StepPlace& place, double loss, double rate) const;

  const WorkerConfig& config_;
  const TrainConfig& train_;
  const Datasets& data_;
  Parallelism& parallelism_;
  ProcessGroup& group_;
  const int rank_;
  const int world_;
  torch::nn::Module& module_;
  const std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<LrSchedule> schedule_;
  const c10::Device device_;
  const bool join_;  // train.uneven_inputs join (world > 1): unpadded shards, ranks without a batch join
  std::optional<GradScaler> scaler_;  // train.precision: fp16
  std::unique_ptr<TrainOrder> order_;  // the epochs' batches: DistributedSampler's, or token windows'
  TrainingCheckpointer checkpointer_;
  TrainPosition resumed_;
  MetricsWriter metrics_;
  TrainResult result_;
  ProgressBar bar_;
  SyncDebug syncDebug_;  // cuda.sync_debug: on between log steps
  NonFiniteTracker nonfinite_;
  std::optional<SampleLog> sampleLog_;               // output.sample_log
  std::unique_ptr<tensorboard::EventWriter> board_;  // output.tensorboard: the scalars
                                                     // torch.utils.tensorboard users log, from rank 0
  std::optional<ProfileWindow> profile_;             // output.profile_start
  // Who arrives last at the gradient all-reduce, looked at on every logged step (world > 1).
  std::optional<StragglerMonitor> straggler_;
  std::unique_ptr<LanguageModelRecords> lm_;  // model.name gpt: tokens/s, MFU, the validation loss
  int64_t validatedStep_ = -1;                // the step of the last validation loss
  double lastValidationSeconds_ = 0;          // its wall time
  std::string stragglerNote(const StragglerReport& report);
  std::optional<StepState> state_;
  std::unique_ptr<TrainStep> step_;  // eager, or train.cuda_graph's
  at::Tensor stopFlag_;            // {stop requested, seconds per step since the last check}: summed
  int64_t nextStopCheck_ = 1;      // the step after which the next stop check runs (CPU, world > 1)
  int64_t lastStopCheckStep_ = 0;
  Clock::time_point lastStopCheck_ = Clock::now();
  // On a GPU nothing between log steps reads the device: the non-finite check is a device flag,
  // read at log steps (and before a checkpoint), and (world > 1) the stop request rides on the log
  // steps' loss all-reduce.
  const bool deviceChecks_;
  bool deviceSkips_ = false;  // the optimizer skips a flagged step on the device
  at::Tensor stopVotes_;      // the last log step's summed stop requests (device), or undefined
  int64_t runSamples_ = 0;    // this process's share of the throughput figure
  int64_t runSteps_ = 0;
  int64_t windowSamples_ = 0;
  int64_t perEpoch_ = 0;           // optimizer steps in a whole epoch
  std::size_t epochBatches_ = 0;   // micro-batch slots in this epoch (from its start): rank 0's batches
                                   // (it holds the most)
  int64_t epochStart_ = 0;         // positions of this epoch's permutation consumed before this run
  int64_t epochStepOffset_ = 0;    // optimizer steps of this epoch taken before this run
  int64_t stepRankSamples_ = 0;   // this rank's samples in the last step (join: the logged loss's weight)
  int64_t jobSteps_ = 0;
  double shownLoss_ = 0;
  double shownRate_ = 0;
  bool done_ = false;
  Clock::time_point start_;
  Clock::time_point windowStart_;
};

}  // namespace ddp::worker::loop
