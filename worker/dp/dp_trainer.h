// Mode dp (DataParallel): one process, one sampler over the whole data set, each batch split over
// the replicas, one loss on the gathered outputs, SGD on the master; trained by the one loop of
// worker/train/training_loop.h (so dp has checkpoints, resume and TensorBoard like ddp).
#pragma once

#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/train/trainer.h"

namespace ddp::worker::dp {

/// Where a dp run places its replicas.
struct DpPlacement {
  std::vector<c10::Device> devices;        // replica i runs on devices[i]; the master lives on devices[0]
  c10::Device outputDevice{c10::kCPU};     // outputs gathered and the loss computed here
};

/// CUDA (device: cuda, or auto with GPUs visible): dp.device_ids (logical ids, after
/// CUDA_VISIBLE_DEVICES; default all visible) and dp.output_device (default device_ids[0]).
/// CPU: dp.replicas replicas. Throws ConfigError naming the key on bad ids.
DpPlacement resolveDpPlacement(const WorkerConfig& config);

struct DpResult {
  TrainResult train;
  std::vector<int64_t> peakAllocatedBytes;  // CUDA: per device of the placement; CPU: empty
};

class DpTrainer {
 public:
  /// `group`: this process's group of one (mode dp is one process), on the master's device.
  DpTrainer(const WorkerConfig& config, DpPlacement placement, ProcessGroup group);

  /// Trains, evaluates and writes metrics.jsonl, the export (and rank0_params.pt when asked).
  DpResult run(const Datasets& data);

 private:
  const WorkerConfig& config_;
  DpPlacement placement_;
  ProcessGroup group_;
};

}  // namespace ddp::worker::dp
