#include "worker/model_export.h"

#include <torch/nn/module.h>
#include <torch/serialize.h>

#include <fstream>
#include <iterator>
#include <vector>

#include "common/error.h"
#include "worker/atomic_file.h"

namespace ddp::worker {
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
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [key, tensor] : state) dict.insert(key, tensor);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  writeFileAtomic(path, std::string_view(bytes.data(), bytes.size()));
}

std::map<std::string, at::Tensor> readStateDict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DDP_THROW(CheckpointError, "cannot read model file '", path, "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string what = e.what();
    DDP_THROW(CheckpointError, "'", path, "' is not a readable torch file: ", what.substr(0, what.find('\n')));
  }
  if (!value.isGenericDict()) DDP_THROW(CheckpointError, "'", path, "' does not hold a dict of tensors");
  std::map<std::string, at::Tensor> out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) {
      DDP_THROW(CheckpointError, "'", path, "' has a non-tensor entry; expected a state_dict");
    }
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

}  // namespace ddp::worker
