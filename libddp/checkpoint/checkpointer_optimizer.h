// The optimizer's part of a training checkpoint (ddp::Checkpointer), by optimizer class.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "libddp/checkpoint/training_checkpoint.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace ddp {
class ProcessGroup;
class ZeroRedundancyOptimizer;
}  // namespace ddp

namespace ddp::checkpoint {

/// The key of an optimizer saved as its own torch::serialize archive (one uint8 tensor): any class
/// other than SGD, Adam, AdamW and ddp::FusedAdamW, whose state is saved by parameter name.
inline constexpr const char* kArchiveKey = "torch_archive";

/// This rank's optimizer state: by parameter name ("momentum_buffer.<name>", "exp_avg.<name>", ...)
/// where the class allows, else {kArchiveKey, archive}. CPU copies.
NamedTensors optimizerState(torch::optim::Optimizer& optimizer, const torch::nn::Module& module);

/// A ZeroRedundancyOptimizer's whole state by name, every rank's shard broadcast in turn
/// (collective: every rank calls it and ends with the whole state). ConfigError unless its local
/// optimizer is SGD, Adam or AdamW.
NamedTensors gatherShardedState(ProcessGroup& group, ZeroRedundancyOptimizer& zero, const torch::nn::Module& module);

/// Puts `saved` (from `path`, for messages) into `optimizer`, tensors onto `device`: CheckpointError
/// naming `path` when it holds another optimizer's state or does not fit the parameters.
void restoreOptimizerState(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                           const NamedTensors& saved, const std::string& path, c10::Device device);

}  // namespace ddp::checkpoint
