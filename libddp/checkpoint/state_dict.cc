// ddp::stateDict, saveStateDict, loadTensors (include/ddp/state_dict.h).
#include "ddp/state_dict.h"

#include <torch/nn/module.h>

#include "common/error.h"
#include "libddp/checkpoint/state_dict_loader.h"
#include "libddp/checkpoint/torch_file.h"
#include "libddp/checkpoint/torch_file_writer.h"

namespace ddp {
namespace {

std::string plainKey(std::string key) {
  static const std::string kPrefix = "module.";
  while (key.rfind(kPrefix, 0) == 0) key.erase(0, kPrefix.size());
  return key;
}

const char* kindName(checkpoint::PyValue::Kind kind) {
  using Kind = checkpoint::PyValue::Kind;
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "a bool";
    case Kind::kInt: return "an int";
    case Kind::kFloat: return "a float";
    case Kind::kString: return "a string";
    case Kind::kTuple: return "a tuple";
    case Kind::kList: return "a list";
    case Kind::kDict: return "a dict";
    case Kind::kTensor: return "a tensor";
    case Kind::kOther: return "an object";
  }
  return "an object";
}

}  // namespace

StateDict stateDict(const torch::nn::Module& module) {
  StateDict out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out[plainKey(item.key())] = item.value().detach().to(at::kCPU).contiguous().clone();
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out[plainKey(item.key())] = item.value().detach().to(at::kCPU).contiguous().clone();
  }
  return out;
}

void saveStateDict(const StateDict& state, const std::string& path) {
  // An OrderedDict of CPU tensors, as Python's torch.save(model.state_dict()) holds.
  auto dict = checkpoint::pyOrderedDict();
  for (const auto& [key, tensor] : state) checkpoint::pySet(*dict, key, checkpoint::pyTensor(tensor));
  checkpoint::writeTorchFile(*dict, path);
}

StateDict loadModelStateDict(const std::string& path) {
  StateDict out;
  for (auto& [key, tensor] : checkpoint::modelFileEntries(path)) out[key] = std::move(tensor);
  return out;
}

ModelFile readModelFile(const std::string& path) {
  checkpoint::ModelFileContents contents = checkpoint::readModelFileContents(path);
  ModelFile out;
  for (auto& [key, tensor] : contents.entries) out.state[key] = std::move(tensor);
  out.modelArgs = std::move(contents.modelArgs);
  out.config = std::move(contents.config);
  return out;
}

StateDict loadTensors(const std::string& path) {
  const checkpoint::PyValuePtr root = checkpoint::readTorchFile(path);
  if (root->kind != checkpoint::PyValue::Kind::kDict) {
    const std::string what = root->kind == checkpoint::PyValue::Kind::kOther
                                 ? "an object of " + root->text : std::string(kindName(root->kind));
    DDP_THROW(CheckpointError, "'", path, "' holds ", what, ", not a dict of tensors; save a dict "
              "(Python: torch.save({\"name\": tensor, ...}, path))");
  }
  StateDict out;
  for (const auto& [key, tensor] : checkpoint::tensorEntries(*root)) out[key] = tensor;
  return out;
}

}  // namespace ddp
