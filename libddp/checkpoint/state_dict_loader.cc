#include "libddp/checkpoint/state_dict_loader.h"

#include <c10/core/GradMode.h>
#include <spdlog/fmt/fmt.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "common/error.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/sharded_checkpoint.h"
#include "libddp/checkpoint/torch_file.h"
#include "libddp/checkpoint/training_checkpoint.h"

namespace ddp::checkpoint {
namespace {

std::string shapeOf(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

std::string joinList(const std::vector<std::string>& items, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += ", ... (" + std::to_string(items.size() - limit) + " more)";
  return out;
}

}  // namespace

std::string stripWrapperPrefix(std::string key) {
  for (const std::string prefix : {"module.", "_orig_mod."}) {
    while (key.rfind(prefix, 0) == 0) key.erase(0, prefix.size());
  }
  return key;
}

namespace {

std::map<std::string, at::Tensor> moduleTargets(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> targets;
  for (const auto& item : module.named_parameters(true)) targets[item.key()] = item.value();
  for (const auto& item : module.named_buffers(true)) targets[item.key()] = item.value();
  return targets;
}

std::map<std::string, at::Tensor> givenEntries(const std::vector<std::pair<std::string, at::Tensor>>& entries) {
  std::map<std::string, at::Tensor> given;
  for (const auto& [key, value] : entries) given[stripWrapperPrefix(key)] = value;
  return given;
}

void checkFits(const std::map<std::string, at::Tensor>& targets, const std::map<std::string, at::Tensor>& given,
               const std::string& source) {
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  std::vector<std::string> shapes;
  for (const auto& [key, target] : targets) {
    auto it = given.find(key);
    if (it == given.end()) {
      missing.push_back(key);
    } else if (!it->second.sizes().equals(target.sizes())) {
      shapes.push_back(key + " " + shapeOf(it->second) + " in the file vs " + shapeOf(target) + " in the model");
    }
  }
  for (const auto& [key, value] : given) {
    if (!targets.count(key)) unexpected.push_back(key);
  }
  // Not one key in common: another model altogether, which lists of every key would only bury.
  if (!targets.empty() && !given.empty() && missing.size() == targets.size()) {
    std::vector<std::string> theirs;
    for (const auto& [key, value] : given) theirs.push_back(key);
    throw CheckpointError("'" + source + "' holds another model: none of its " + std::to_string(given.size()) +
                          " keys (" + joinList(theirs, 3) + ") is one of the configured model's " +
                          std::to_string(targets.size()) + " (" + joinList(missing, 3) +
                          "); check that the model is built as the one that wrote it (same layers and sizes)");
  }
  if (!missing.empty() || !unexpected.empty() || !shapes.empty()) {
    std::string message = "'" + source + "' does not fit the configured model:";
    if (!missing.empty()) message += " missing keys: " + joinList(missing) + ";";
    if (!unexpected.empty()) message += " unexpected keys: " + joinList(unexpected) + ";";
    if (!shapes.empty()) message += " shape differences: " + joinList(shapes) + ";";
    message += " check that the model is built as the one that wrote it (same layers and sizes)";
    throw CheckpointError(message);
  }
}

}  // namespace

void checkStateDictFits(const torch::nn::Module& module,
                        const std::vector<std::pair<std::string, at::Tensor>>& entries,
                        const std::string& source) {
  checkFits(moduleTargets(module), givenEntries(entries), source);
}

void loadStateDictInto(torch::nn::Module& module,
                       const std::vector<std::pair<std::string, at::Tensor>>& entries,
                       const std::string& source) {
  std::map<std::string, at::Tensor> targets = moduleTargets(module);
  const std::map<std::string, at::Tensor> given = givenEntries(entries);
  checkFits(targets, given, source);
  c10::NoGradGuard noGrad;
  for (auto& [key, target] : targets) {
    target.copy_(given.at(key).to(target.device(), target.scalar_type()));
  }
}

namespace {

// A scalar of a pickled dict as text: ints and floats as Python prints them (shortest round trip),
// bools as YAML's true/false, None as null; false when the value is not a scalar.
bool scalarText(const PyValue& value, std::string& out) {
  switch (value.kind) {
    case PyValue::Kind::kInt: out = std::to_string(value.integer); return true;
    case PyValue::Kind::kFloat:
      out = fmt::format("{}", value.real);
      if (out.find_first_of(".einf") == std::string::npos) out += ".0";  // Python's 0.0, not fmt's 0
      return true;
    case PyValue::Kind::kBool: out = value.boolean ? "true" : "false"; return true;
    case PyValue::Kind::kString: out = value.text; return true;
    case PyValue::Kind::kNone: out = "null"; return true;
    default: return false;
  }
}

}  // namespace

ModelFileContents readModelFileContents(const std::string& path) {
  // A sharded training checkpoint (a directory with its manifest) is one of our checkpoints too:
  // its model, every tensor whole.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) && std::filesystem::exists(std::filesystem::path(path) / kShardedManifest, ec)) {
    TrainingState state = loadTrainingStateFor(path, nullptr);
    return {std::move(state.model), {}, std::move(state.config)};
  }
  const PyValuePtr root = readTorchFile(path);
  if (root->kind != PyValue::Kind::kDict) {
    DDP_THROW(CheckpointError, "'", path, "' does not hold a dict; expected a state_dict (torch.save(model.state_dict(), path))");
  }
  // A training checkpoint carries a checksum: every reader verifies it, not only resume.
  if (const PyValue* format = root->get("format"); format && format->text == kCheckpointFormat) {
    TrainingState state = loadTrainingCheckpoint(path);
    return {std::move(state.model), {}, std::move(state.config)};
  }
  ModelFileContents out;
  const PyValue* state = root.get();
  for (const char* key : {"model", "state_dict", "model_state_dict"}) {
    if (const PyValue* nested = root->get(key); nested && nested->kind == PyValue::Kind::kDict) {
      state = nested;
      break;
    }
  }
  // nanoGPT's ckpt.pt: {"model": ..., "model_args": {"n_layer": 6, "n_head": 6, ...}, ...}
  if (const PyValue* args = root->get("model_args"); state != root.get() && args && args->kind == PyValue::Kind::kDict) {
    for (const auto& [key, value] : args->entries) {
      std::string text;
      if (key->kind == PyValue::Kind::kString && scalarText(*value, text)) out.modelArgs[key->text] = text;
    }
  }
  out.entries = tensorEntries(*state);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> modelFileEntries(const std::string& path) {
  return readModelFileContents(path).entries;
}

void loadModelFile(torch::nn::Module& module, const std::string& path) {
  loadStateDictInto(module, modelFileEntries(path), path);
}

}  // namespace ddp::checkpoint
