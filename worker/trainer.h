// The DDP / single-process training loop: sampler shard → forward → backward →
// gradient all-reduce → SGD step; then whole-test-set evaluation and rank-0 export.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "comm/communicator.h"
#include "worker/config.h"
#include "worker/data/tensor_dataset.h"
#include "worker/models.h"

namespace ddp::worker {

struct TrainResult {
  int64_t steps = 0;           // optimizer steps taken
  int64_t samples = 0;         // training samples consumed over all ranks
  double trainSeconds = 0;     // wall time of the training loop (no evaluation)
  double samplesPerSecond = 0; // over all ranks
  double finalLoss = 0;        // mean over ranks of the last step's loss
  int64_t testCorrect = 0;
  int64_t testTotal = 0;
  double testAccuracy = 0;     // testCorrect / testTotal over the whole test set
  std::string exportPath;      // rank 0 only
  int stopSignal = 0;          // nonzero: stopped early on this signal after saving checkpointPath
  std::string checkpointPath;
};

struct Datasets {
  data::TensorDataset train;
  data::TensorDataset test;
  InputSpec input;
};

/// Loads the configured data set (every rank reads it whole; the sampler picks the shard).
Datasets loadDatasets(const DataConfig& config, uint64_t seed);

class Trainer {
 public:
  Trainer(const WorkerConfig& config, comm::Communicator& comm, c10::Device device);

  /// Trains, evaluates and (rank 0) writes metrics.jsonl, summary.json and the export.
  TrainResult run(const Datasets& data);

 private:
  const WorkerConfig& config_;
  comm::Communicator& comm_;
  c10::Device device_;
};

}  // namespace ddp::worker
