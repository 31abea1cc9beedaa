// Loads a state_dict from anywhere into a module: keys with or without
// "module." prefixes (DataParallel / DDP), tensors saved on GPU or CPU, from
// Python's torch.save or from us. A mismatch is one error listing everything.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace ddp::checkpoint {

/// "module.fc1.weight" → "fc1.weight" (any number of wrapper prefixes).
std::string stripWrapperPrefix(std::string key);

/// Copies `entries` into `module`'s parameters and buffers (converted to each
/// one's device and dtype). Throws CheckpointError naming `source` and listing
/// missing keys, unexpected keys and shape differences, before changing anything.
void loadStateDictInto(torch::nn::Module& module,
                       const std::vector<std::pair<std::string, at::Tensor>>& entries,
                       const std::string& source);

/// loadStateDictInto's check alone: CheckpointError (the same line) when `entries` do not fit
/// `module`; changes nothing. Resume runs it before the file's seed and sample order are compared,
/// so another model's checkpoint is named as such, not as a different seed.
void checkStateDictFits(const torch::nn::Module& module,
                        const std::vector<std::pair<std::string, at::Tensor>>& entries,
                        const std::string& source);

/// Reads a model file (a state_dict, or a checkpoint dict with a "model" /
/// "state_dict" / "model_state_dict" entry) and loads it into `module`.
void loadModelFile(torch::nn::Module& module, const std::string& path);

/// The (key, tensor) entries loadModelFile() loads from `path`, keys as the file has them.
std::vector<std::pair<std::string, at::Tensor>> modelFileEntries(const std::string& path);

/// A model file's entries and what it records of the model that wrote it (ddp::readModelFile).
struct ModelFileContents {
  std::vector<std::pair<std::string, at::Tensor>> entries;
  std::map<std::string, std::string> modelArgs;  // a checkpoint dict's "model_args" scalars, as text
  std::string config;                            // our training checkpoint's recorded config
};
ModelFileContents readModelFileContents(const std::string& path);

}  // namespace ddp::checkpoint
