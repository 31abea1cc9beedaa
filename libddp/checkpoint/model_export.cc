#include "libddp/checkpoint/model_export.h"

#include <torch/nn/module.h>

#include "common/error.h"
#include "libddp/checkpoint/torch_file.h"
#include "libddp/checkpoint/torch_file_writer.h"

namespace ddp::checkpoint {
namespace {

std::string plainKey(std::string key) {
  static const std::string kPrefix = "module.";
  while (key.rfind(kPrefix, 0) == 0) key.erase(0, kPrefix.size());
  return key;
}

}  // namespace

std::map<std::string, at::Tensor> stateDict(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out[plainKey(item.key())] = item.value().detach().to(at::kCPU).contiguous().clone();
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out[plainKey(item.key())] = item.value().detach().to(at::kCPU).contiguous().clone();
  }
  return out;
}

void exportStateDict(const std::map<std::string, at::Tensor>& state, const std::string& path) {
  // An OrderedDict of CPU tensors, as Python's torch.save(model.state_dict()) holds.
  auto dict = checkpoint::pyOrderedDict();
  for (const auto& [key, tensor] : state) checkpoint::pySet(*dict, key, checkpoint::pyTensor(tensor));
  checkpoint::writeTorchFile(*dict, path);
}

std::map<std::string, at::Tensor> readStateDict(const std::string& path) {
  const checkpoint::PyValuePtr root = checkpoint::readTorchFile(path);
  if (root->kind != checkpoint::PyValue::Kind::kDict) {
    DDP_THROW(CheckpointError, "'", path, "' does not hold a dict of tensors");
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, value] : root->entries) {
    if (key->kind != checkpoint::PyValue::Kind::kString || value->kind != checkpoint::PyValue::Kind::kTensor) {
      DDP_THROW(CheckpointError, "'", path, "' has a non-tensor entry; expected a state_dict");
    }
    out[key->text] = value->tensor;
  }
  return out;
}

}  // namespace ddp::checkpoint
