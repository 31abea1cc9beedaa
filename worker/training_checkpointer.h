// Training checkpoints inside the loop: resume at the start (every rank loads
// and maps to its own device), saves when due (rank 0 writes, all ranks wait).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "worker/config.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class SGD;
}

namespace ddp::worker {

/// Where training stands: the next step to take is step `stepInEpoch` of `epoch`.
struct TrainPosition {
  int64_t epoch = 0;
  int64_t stepInEpoch = 0;  // optimizer steps already done in `epoch`
  int64_t globalStep = 0;   // optimizer steps done in total
  int64_t samples = 0;      // samples consumed in total, all ranks
};

class TrainingCheckpointer {
 public:
  /// `device` is this rank's compute device: its GPU's generator is saved and restored per rank.
  TrainingCheckpointer(const WorkerConfig& config, comm::Communicator& comm, c10::Device device);

  /// Applies config.resume (auto | path) to `module` and `optimizer` and the RNGs;
  /// returns where to continue (the start when there is nothing to resume).
  /// Collective. Throws CheckpointError for an explicit path that does not load.
  TrainPosition resume(torch::nn::Module& module, torch::optim::SGD& optimizer);

  /// Saves if checkpoint.every_steps / every_epochs says so. Collective.
  void maybeSave(torch::nn::Module& module, torch::optim::SGD& optimizer, const TrainPosition& position,
                 bool epochEnded);

  /// Saves now (e.g. on SIGTERM) and returns the path. Collective.
  std::string save(torch::nn::Module& module, torch::optim::SGD& optimizer, const TrainPosition& position);

 private:
  std::vector<at::Tensor> gatherCudaRngStates();

  const WorkerConfig& config_;
  comm::Communicator& comm_;
  c10::Device device_;
  std::string dir_;
  int64_t lastSavedStep_ = -1;
};

}  // namespace ddp::worker
