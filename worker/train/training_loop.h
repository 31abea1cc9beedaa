// The one training loop of every mode (ddp, single, dp): epochs of sampler shards, each step run by
// a step strategy (worker/train/eager_step.h, graph_step.h), then the step's records (metrics,
// progress, TensorBoard, the sample log, the profiler's window), checkpoint and stop vote; at the end
// evaluation and the rank-0 export. What differs between the modes is a Parallelism.
#pragma once

#include <c10/core/Device.h>

#include "worker/config/config.h"
#include "worker/data/datasets.h"
#include "worker/train/parallelism.h"
#include "worker/train/trainer.h"

namespace ddp::worker {

/// Trains `parallelism.module()` on data.train per config.train; then evaluation, rank<r>_params.pt
/// when asked, and rank 0's export. Rank 0 writes metrics.jsonl (and TensorBoard).
TrainResult runTrainingLoop(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism,
                            c10::Device device);

}  // namespace ddp::worker
