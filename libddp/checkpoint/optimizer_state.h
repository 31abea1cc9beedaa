// What exact resume needs beyond the weights: SGD momentum buffers by
// parameter name, and the RNG states.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "libddp/checkpoint/training_checkpoint.h"

namespace torch::optim {
class Optimizer;
class SGD;
}

namespace ddp::checkpoint {

/// "momentum_buffer.<name>" for each parameter that has one (CPU copies).
NamedTensors sgdMomentumBuffers(torch::optim::SGD& optimizer, const NamedTensors& namedParams);

/// Installs saved buffers (moved to each parameter's device). Throws
/// CheckpointError naming `source` if a buffer's parameter is unknown or its shape differs.
void restoreSgdMomentumBuffers(torch::optim::SGD& optimizer, const NamedTensors& namedParams,
                               const NamedTensors& buffers, const std::string& source);

/// Adam's and AdamW's state as Python's names it, by parameter name: "exp_avg.<name>",
/// "exp_avg_sq.<name>", "max_exp_avg_sq.<name>" (amsgrad) and "step.<name>" (int64), CPU copies.
/// Empty for other optimizers (isAdam() says which).
bool isAdam(const torch::optim::Optimizer& optimizer);
NamedTensors adamMoments(torch::optim::Optimizer& optimizer, const NamedTensors& namedParams);
/// Installs them; CheckpointError naming `source` for an unknown parameter, a wrong shape or a
/// parameter with some of its entries missing.
void restoreAdamMoments(torch::optim::Optimizer& optimizer, const NamedTensors& namedParams,
                        const NamedTensors& saved, const std::string& source);
/// Whether `saved` holds Adam's (AdamW's) entries.
bool holdsAdamMoments(const NamedTensors& saved);

/// The default CPU generator's state, and one per visible GPU.
at::Tensor cpuRngState();
void setCpuRngState(const at::Tensor& state);
/// The state of `device`'s default CUDA generator (a rank's own GPU); undefined on CPU.
at::Tensor cudaRngState(c10::Device device);
/// Restores `device`'s generator; no-op for CPU devices or an undefined state.
void setCudaRngState(c10::Device device, const at::Tensor& state);

}  // namespace ddp::checkpoint
