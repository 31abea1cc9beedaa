// Mode ddp / single: one replica per process, gradients averaged over the group (DdpEngine or the
// flat all-reduce), trained by the one loop of worker/train/training_loop.h.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddp/process_group.h"
#include "worker/config/config.h"
#include "worker/data/datasets.h"
#include "worker/models/models.h"

namespace ddp::worker {

struct TrainResult {
  int64_t steps = 0;           // optimizer steps taken (skipped ones included: the schedule counts them)
  int64_t skippedSteps = 0;    // steps not applied: fp16 overflow (the loss scaler), train.skip_nonfinite_steps
  int64_t samples = 0;         // training samples consumed over all ranks
  double trainSeconds = 0;     // wall time of the training loop (no evaluation)
  double samplesPerSecond = 0; // over all ranks
  double finalLoss = 0;        // mean over ranks of the last step's loss; NaN when this run took no step
  bool outputsKept = false;    // resumed at the run's end with its outputs there: nothing trained or written
  bool tookNoStep = false;     // resumed at the run's end, outputs evaluated and exported anew
  int64_t testCorrect = 0;
  int64_t testTotal = 0;
  double testAccuracy = 0;     // testCorrect / testTotal over the whole test set
  double evalSeconds = 0;      // wall time of that evaluation (0 when eval.enabled is false)
  std::string exportPath;      // rank 0 only
  int stopSignal = 0;          // nonzero: stopped early on this signal after saving checkpointPath
  std::string checkpointPath;
  // comm.hook powersgd: gradient elements per rank before and after compression (PowerSGD's
  // compression_stats over the compressed iterations); 0 otherwise.
  int64_t optimizerStateBytes = 0;  // this rank's optimizer state (train.zero: its shard)
  int64_t parameterBytes = 0;       // this rank's parameters (full: its padded shards; zero2: + the whole ones)
  int64_t gradientBytes = 0;        // this rank's gradients (full: its sharded gradients)
  int64_t gradientElements = 0;
  int64_t gradientElementsSent = 0;
  // ddp::StragglerMonitor at the logged steps (world > 1): how often each rank arrived markedly last
  // at the gradient all-reduce, and the largest lateness seen, with its rank.
  std::vector<int64_t> stragglerCounts;
  double stragglerMaxSkewS = 0;
  int stragglerMaxSkewRank = -1;
  // Language models (model.name gpt): the last validation loss (negative: none), tokens/s over all
  // ranks, and nanoGPT's MFU per device (negative: no peak FLOP/s known).
  double valLoss = -1;
  int64_t valLossStep = -1;  // the step valLoss was measured after (the last one unless eval.enabled is false)
  double tokensPerSecond = 0;
  double mfu = -1;
  // Streamed images (data.stream): whether the job streamed, and the bad images every rank left
  // out (data.skip_bad_images), training and evaluation.
  bool streamedImages = false;
  int64_t skippedImages = 0;
};

/// Stops training with one line: what diverged, and where the last good state is.
[[noreturn]] void throwDiverged(const WorkerConfig& config, const std::string& what);

/// train.skip_nonfinite_steps skips at most this many steps in a row: more means the weights
/// themselves went bad, and skipping on would only hide it.
constexpr int64_t kMaxSkippedInARow = 10;

/// Writes the trained model to `path`. When it cannot be written there (a full disk, a directory
/// gone) the training is not thrown away: the model goes to checkpoint.dir, else the temporary
/// directory, and the CheckpointError names where it went (or, failing all, the newest checkpoint).
void exportTrainedModel(const WorkerConfig& config, const std::map<std::string, at::Tensor>& state,
                        const std::string& path);

class Trainer {
 public:
  /// `group`: the job's process group (its device is this rank's).
  Trainer(const WorkerConfig& config, ProcessGroup group);

  /// Trains, evaluates and (rank 0) writes metrics.jsonl, summary.json and the export.
  TrainResult run(const Datasets& data);

 private:
  const WorkerConfig& config_;
  ProcessGroup group_;
};

}  // namespace ddp::worker
