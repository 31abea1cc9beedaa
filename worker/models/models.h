// The models the worker trains. Parameter names match the equivalent Python
// modules (README: "Loading the export in Python"), so an export loads with
// load_state_dict(strict=True).
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <vector>

#include "ddp/process_group.h"
#include "ddp/state_dict.h"
#include "worker/config/config.h"
#include "worker/models/sharded_units.h"

namespace ddp::worker {

/// Shape of one sample and the number of classes.
struct InputSpec {
  int64_t channels = 1;
  int64_t height = 28;
  int64_t width = 28;
  int64_t classes = 10;
};

/// Flatten → fc1 → ReLU → ... → fc{n+1}, e.g. 784-512-256-10. train.sharding full: fc1..fc{n}
/// one unit each (the output layer stays with the root).
class MlpImpl : public torch::nn::Cloneable<MlpImpl>, public ShardedUnits {
 public:
  MlpImpl(const InputSpec& input, std::vector<int64_t> hidden);
  void reset() override;
  at::Tensor forward(at::Tensor x);
  std::vector<torch::nn::Module*> unitModules() override;

 private:
  InputSpec input_;
  std::vector<int64_t> hidden_;
  std::vector<torch::nn::Linear> layers_;
};
TORCH_MODULE(Mlp);

/// conv1(32, 3x3, pad 1) → [bn1] → ReLU → pool 2 → conv2(64) → [bn2] → ReLU → pool 2 →
/// fc1(128) → ReLU → fc2. bn1/bn2 (BatchNorm2d) only with `batchNorm`; given `syncGroup`, they are
/// ddp::SyncBatchNorm over that group (same parameter and buffer names). train.sharding full:
/// conv1, conv2 and fc1 one unit each (fc2 and the BatchNorms stay with the root).
class CnnImpl : public torch::nn::Cloneable<CnnImpl>, public ShardedUnits {
 public:
  explicit CnnImpl(const InputSpec& input, bool batchNorm = false, const ProcessGroup* syncGroup = nullptr);
  void reset() override;
  at::Tensor forward(at::Tensor x);
  std::vector<torch::nn::Module*> unitModules() override;

 private:
  InputSpec input_;
  bool batchNorm_;
  std::shared_ptr<ProcessGroup> syncGroup_;  // null: plain BatchNorm2d
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::AnyModule bn1_;  // BatchNorm2d or ddp::SyncBatchNorm
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::AnyModule bn2_;
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};
TORCH_MODULE(Cnn);

/// Builds the configured model with freshly initialised parameters (seed the
/// generator first for a reproducible start).
/// `group`: the training group, for model.sync_batch_norm (null: plain BatchNorm, as in evaluation).
torch::nn::AnyModule makeModel(const ModelConfig& config, const InputSpec& input, const ProcessGroup* group = nullptr);

/// The model's state dict as Python names it: the module's own, plus for gpt nanoGPT's tied
/// "lm_head.weight" (what the export holds).
StateDict modelStateDict(const torch::nn::Module& module);

/// The export's keys from `state` (the module's own keys, e.g. ddp::fullStateDict's): gpt adds
/// nanoGPT's tied "lm_head.weight", as modelStateDict does.
StateDict withExportKeys(const torch::nn::Module& module, StateDict state);

/// init.model_path / mode eval: a model file into `module` (ddp::loadModel; gpt: nanoGPT's keys, with
/// or without lm_head.weight, "module." or "_orig_mod.").
void loadModelWeights(torch::nn::Module& module, const std::string& path);

class GptImpl;
/// A GPT's model file (`file`, read from `path`) into `model`: first the settings the file records
/// (nanoGPT's model_args, our checkpoint's config) against the model's (checkGptSettings), then
/// its tensors (loadGptStateDict).
void loadGptModelFile(GptImpl& model, ModelFile file, const std::string& path);

/// Resume: when `module` is a GPT, checkGptSettings against the settings its checkpoint's recorded
/// config (`recordedConfig`, the YAML of the run that wrote it; "" compares nothing) names: a resume
/// with another n_head would continue another model from the weights (no tensor's shape shows it).
void checkResumedModelSettings(const torch::nn::Module& module, const std::string& recordedConfig,
                               const std::string& source);

}  // namespace ddp::worker
