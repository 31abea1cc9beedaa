// State dicts as Python's torch.save writes them: a module's parameters and buffers by name, saved
// and read in the zip format torch.load reads (ddp::saveModel / ddp::loadModel are these on a
// module, with checks of every key).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace ddp {

/// Tensors by their dotted names, as Python's module.state_dict() holds them.
using StateDict = std::map<std::string, at::Tensor>;

/// The module's parameters and buffers by their dotted names: detached, contiguous CPU copies, any
/// leading "module." (a DataParallel/DDP wrapper's) removed.
StateDict stateDict(const torch::nn::Module& module);

/// torch.save(state_dict, path): an OrderedDict of CPU tensors that Python's torch.load reads on
/// any machine. Written atomically (ddp::writeFileAtomic); CheckpointError on failure.
void saveStateDict(const StateDict& state, const std::string& path);

/// The tensors of the dict a torch.save file holds at its top level (a state_dict, or e.g.
/// torch.save({"x": images, "y": labels}, path)), by key, on the CPU; entries that are not tensors
/// are left out. CheckpointError, naming the path, when the file is missing, is not a torch.save
/// file of PyTorch >= 1.6 (the zip format), is damaged, or holds something other than a dict.
/// Python: {k: v for k, v in torch.load(path).items() if isinstance(v, torch.Tensor)}.
StateDict loadTensors(const std::string& path);

/// The state dict of a model file, as ddp::loadModel finds it: a state_dict saved by Python or by
/// us, the dict under "model", "state_dict" or "model_state_dict" of a checkpoint dict (nanoGPT's
/// ckpt.pt: {"model": ..., "optimizer": ..., ...}), or the model of our training checkpoint (its
/// checksum verified). Keys as the file has them ("module.", "_orig_mod." kept), CPU tensors.
/// CheckpointError as loadTensors'. For a model whose keys differ from its modules' (tied
/// weights), where ddp::loadModel's strict match cannot apply.
StateDict loadModelStateDict(const std::string& path);

/// A model file's state dict and what the file records of the model that wrote it: settings a
/// state dict cannot show (nanoGPT's n_head shapes no tensor), to check before loading.
struct ModelFile {
  StateDict state;  // as loadModelStateDict returns it
  /// The scalars of a checkpoint dict's "model_args" (nanoGPT's ckpt.pt: n_layer, n_head, n_embd,
  /// block_size, bias, vocab_size, dropout) as text: ints and floats as Python prints them, bools
  /// "true"/"false", None "null". Empty for a plain state_dict.
  std::map<std::string, std::string> modelArgs;
  /// Our training checkpoint's (ckpt-STEP.pt or a sharded ckpt-STEP/) recorded settings, the
  /// text ddp::CheckpointOptions::config held (the worker's resolved YAML). Empty for other files.
  std::string config;
};

/// loadModelStateDict's state dict with the file's model_args and recorded config; read once.
ModelFile readModelFile(const std::string& path);

}  // namespace ddp
