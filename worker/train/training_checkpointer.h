// Training checkpoints inside the worker's loop: ddp::Checkpointer (the public API) driven by the
// config's checkpoint.* and resume keys.
#pragma once

#include <string>
#include <vector>

#include "ddp/ddp.h"
#include "worker/config/config.h"

namespace ddp::worker {

using TrainPosition = ::ddp::TrainPosition;

class TrainingCheckpointer {
 public:
  /// The group's device is this rank's: its GPU's generator is saved and restored per rank.
  /// `cudaGenerators`: mode dp's replica GPUs, whose generators are saved and restored in order.
  /// `trainSamples`: the training set's size, which the epochs' order depends on (with seed and
  /// train.shuffle): a checkpoint of another one is refused at resume.
  TrainingCheckpointer(const WorkerConfig& config, ProcessGroup group, int64_t trainSamples,
                       std::vector<c10::Device> cudaGenerators = {});
  // Its Checkpointer calls back into it: it stays where it was made.
  TrainingCheckpointer(const TrainingCheckpointer&) = delete;
  TrainingCheckpointer& operator=(const TrainingCheckpointer&) = delete;
  /// Applies config.resume (auto | path) to `module` and `optimizer` and the RNGs;
  /// returns where to continue (the start when there is nothing to resume).
  /// Collective. Throws CheckpointError for an explicit path that does not load.
  /// With a scaler (train.precision: fp16), its state is restored as well.
  TrainPosition resume(torch::nn::Module& module, torch::optim::Optimizer& optimizer, GradScaler* scaler = nullptr);
  /// Whether checkpoint.every_steps / every_epochs asks for a checkpoint at `position`.
  bool due(const TrainPosition& position, bool epochEnded) const;
  /// Saves if checkpoint.every_steps / every_epochs says so. Collective.
  void maybeSave(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const TrainPosition& position,
                 bool epochEnded, const GradScaler* scaler = nullptr);
  /// Saves now (e.g. on SIGTERM) and returns the path. Collective.
  std::string save(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const TrainPosition& position,
                   const GradScaler* scaler = nullptr);

 private:
  CheckpointOptions withRecordedConfigCheck(CheckpointOptions options);

  const WorkerConfig& config_;
  int rank_;
  const torch::nn::Module* resuming_ = nullptr;  // the module resume() loads into, while it does
  Checkpointer checkpointer_;  // also knows the last step saved: a step is never written twice
};

}  // namespace ddp::worker
