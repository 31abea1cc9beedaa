#include "worker/models/models.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "common/error.h"
#include "ddp/checkpoint.h"
#include "ddp/sync_batch_norm.h"
#include "worker/models/gpt.h"
#include "worker/models/resnet.h"
#include "worker/models/torchscript_model.h"

namespace ddp::worker {
namespace F = torch::nn::functional;

MlpImpl::MlpImpl(const InputSpec& input, std::vector<int64_t> hidden)
    : input_(input), hidden_(std::move(hidden)) {
  reset();
}

void MlpImpl::reset() {
  layers_.clear();
  int64_t width = input_.channels * input_.height * input_.width;
  std::vector<int64_t> outs = hidden_;
  outs.push_back(input_.classes);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    layers_.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, outs[i])));
    width = outs[i];
  }
}

at::Tensor MlpImpl::forward(at::Tensor x) {
  x = x.flatten(1);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    x = runUnit(i, [this, i](const at::Tensor& in) { return layers_[i]->forward(in); }, x);
    if (i + 1 < layers_.size()) x = F::relu(x);
  }
  return x;
}

std::vector<torch::nn::Module*> MlpImpl::unitModules() {
  std::vector<torch::nn::Module*> units;
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) units.push_back(layers_[i].get());
  return units;
}

CnnImpl::CnnImpl(const InputSpec& input, bool batchNorm, const ProcessGroup* syncGroup)
    : input_(input),
      batchNorm_(batchNorm),
      syncGroup_(syncGroup != nullptr ? std::make_shared<ProcessGroup>(*syncGroup) : nullptr) {
  reset();
}

void CnnImpl::reset() {
  if (input_.height < 4 || input_.width < 4 || input_.height % 4 != 0 || input_.width % 4 != 0) {
    DDP_THROW(ConfigError, "config: model 'cnn' pools twice by 2, so its images' height and width must be "
              "multiples of 4, but the data's samples are ", input_.channels, "x", input_.height, "x", input_.width,
              " (channels x height x width); use model.name=mlp, or images such as [N, C, 28, 28]");
  }
  conv1_ = register_module(
      "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(input_.channels, 32, 3).padding(1)));
  auto batchNorm = [this](const char* name, int64_t channels) {
    if (syncGroup_) return torch::nn::AnyModule(register_module(name, SyncBatchNorm(channels, *syncGroup_)));
    return torch::nn::AnyModule(register_module(name, torch::nn::BatchNorm2d(channels)));
  };
  if (batchNorm_) bn1_ = batchNorm("bn1", 32);
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
  if (batchNorm_) bn2_ = batchNorm("bn2", 64);
  fc1_ = register_module("fc1", torch::nn::Linear(64 * (input_.height / 4) * (input_.width / 4), 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, input_.classes));
}

at::Tensor CnnImpl::forward(at::Tensor x) {
  x = runUnit(0, [this](const at::Tensor& in) { return conv1_->forward(in); }, x);
  if (batchNorm_) x = bn1_.forward(x);
  x = F::max_pool2d(F::relu(x), F::MaxPool2dFuncOptions(2));
  x = runUnit(1, [this](const at::Tensor& in) { return conv2_->forward(in); }, x);
  if (batchNorm_) x = bn2_.forward(x);
  x = F::max_pool2d(F::relu(x), F::MaxPool2dFuncOptions(2));
  x = F::relu(runUnit(2, [this](const at::Tensor& in) { return fc1_->forward(in); }, x.flatten(1)));
  return fc2_->forward(x);
}

std::vector<torch::nn::Module*> CnnImpl::unitModules() { return {conv1_.get(), conv2_.get(), fc1_.get()}; }

torch::nn::AnyModule makeModel(const ModelConfig& config, const InputSpec& input, const ProcessGroup* group) {
  if (config.batchNorm && config.name != "cnn") {
    DDP_THROW(ConfigError, "config: 'model.batch_norm' is true but model '", config.name,
              "' has no optional BatchNorm layers; use model.name: cnn (the ResNets always have theirs) or "
              "model.batch_norm: false");
  }
  torch::nn::AnyModule model;
  if (config.name == "mlp") {
    model = torch::nn::AnyModule(Mlp(input, config.hidden));
  } else if (config.name == "cnn") {
    model = torch::nn::AnyModule(Cnn(input, config.batchNorm, config.syncBatchNorm ? group : nullptr));
  } else if (isResNet(config.name)) {
    model = torch::nn::AnyModule(
        ResNet(ResNetOptions{config.name, input.channels, input.classes}, config.syncBatchNorm ? group : nullptr));
  } else if (config.name == "gpt") {
    GptOptions o{config.nLayer, config.nHead, config.nEmbd, config.blockSize,
                 config.vocabSize > 0 ? config.vocabSize : input.classes, config.dropout, config.bias};
    model = torch::nn::AnyModule(Gpt(o));
  } else if (config.name == "torchscript") {
    model = torch::nn::AnyModule(loadTorchScriptModel(config.path, input));
  } else {
    DDP_THROW(ConfigError, "config: 'model.name' is '", config.name,
              "'; use mlp, cnn, resnet18, resnet34, resnet50, torchscript or gpt");
  }
  if (config.unusedLayer) {
    // Registered last, never called: a parameter the autograd graph does not reach.
    model.ptr()->register_module("unused", torch::nn::Linear(4, 2));
  }
  return model;
}

StateDict modelStateDict(const torch::nn::Module& module) {
  // nanoGPT's keys include the LM head, the tied token embedding (registered once here).
  if (const auto* gpt = dynamic_cast<const GptImpl*>(&module)) return gptStateDict(*gpt);
  return stateDict(module);
}

StateDict withExportKeys(const torch::nn::Module& module, StateDict state) {
  if (dynamic_cast<const GptImpl*>(&module) != nullptr) state["lm_head.weight"] = state.at("transformer.wte.weight");
  return state;
}

namespace {

// A recorded config's model.* keys (nothing when it is not a GPT's: the tensors' check names another model).
RecordedGptSettings settingsOf(const WorkerConfig& saved, const std::string& from) {
  RecordedGptSettings out;
  if (saved.model.name != "gpt") return out;
  const ModelConfig& m = saved.model;
  out.from = from;
  out.values = {{"n_layer", std::to_string(m.nLayer)},   {"n_head", std::to_string(m.nHead)},
                {"n_embd", std::to_string(m.nEmbd)},     {"block_size", std::to_string(m.blockSize)},
                {"bias", m.bias ? "true" : "false"}};
  if (m.vocabSize > 0) out.values["vocab_size"] = std::to_string(m.vocabSize);  // 0: the data's, shown by wte
  return out;
}

// `text` parsed as a config; nullopt for another version's keys (nothing to compare reliably).
std::optional<WorkerConfig> parsedConfig(const std::string& text) {
  try {
    return parseConfig(text);
  } catch (const Error&) {
    return std::nullopt;
  }
}

RecordedGptSettings recordedGptSettings(const ModelFile& file) {
  RecordedGptSettings out;
  if (!file.modelArgs.empty()) {
    out.from = "its model_args";
    for (const auto& [key, value] : file.modelArgs) {
      if (value != "null") out.values[key] = value;
    }
    return out;
  }
  if (file.config.empty()) return out;
  const auto saved = parsedConfig(file.config);
  return saved ? settingsOf(*saved, "its run's config") : out;
}

// An export (a plain state dict) records no settings, but the training run that wrote it left its
// resolved config beside it (output.dir/config.resolved.yaml, written when that run started). Taken
// when it names this file as its export and is not newer than it: a later run in that directory,
// which may not have got as far as exporting, does not describe the file.
RecordedGptSettings settingsBeside(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file(path);
  const fs::path yaml = file.parent_path() / "config.resolved.yaml";
  const auto fileTime = fs::last_write_time(file, ec);
  if (ec) return {};
  const auto yamlTime = fs::last_write_time(yaml, ec);
  if (ec || yamlTime > fileTime) return {};
  std::ifstream in(yaml);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto saved = parsedConfig(text);
  if (!saved || saved->output.exportName != file.filename().string()) return {};
  return settingsOf(*saved, "the config.resolved.yaml of the run that wrote it");
}

}  // namespace

void loadGptModelFile(GptImpl& model, ModelFile file, const std::string& path) {
  const bool recordsNothing = file.modelArgs.empty() && file.config.empty();
  checkGptSettings(model.options(), recordsNothing ? settingsBeside(path) : recordedGptSettings(file), path);
  loadGptStateDict(model, std::move(file.state), path);
}

void checkResumedModelSettings(const torch::nn::Module& module, const std::string& recordedConfig,
                               const std::string& source) {
  if (const auto* gpt = dynamic_cast<const GptImpl*>(&module)) {
    checkGptSettings(gpt->options(), recordedGptSettings(ModelFile{{}, {}, recordedConfig}), source);
  }
}

void loadModelWeights(torch::nn::Module& module, const std::string& path) {
  if (auto* gpt = dynamic_cast<GptImpl*>(&module)) {
    loadGptModelFile(*gpt, readModelFile(path), path);
    return;
  }
  loadModel(module, path);
}

}  // namespace ddp::worker
