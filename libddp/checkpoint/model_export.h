// The rank-0 export: a state_dict with plain keys (no "module." prefix), CPU
// tensors, in the zip format Python's torch.load reads as a dict of tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace torch::nn {
class Module;
}

namespace ddp::checkpoint {

/// Parameters and buffers by their dotted names, detached CPU copies, with any
/// leading "module." (DataParallel/DDP wrappers) removed.
std::map<std::string, at::Tensor> stateDict(const torch::nn::Module& module);

/// Serialises like torch.save(state_dict) and writes the file atomically.
void exportStateDict(const std::map<std::string, at::Tensor>& state, const std::string& path);

/// Reads a file written by exportStateDict (or a compatible torch.save of a dict of tensors).
std::map<std::string, at::Tensor> readStateDict(const std::string& path);

}  // namespace ddp::checkpoint
