// model.name: torchscript — a model written in Python and saved with
// torch.jit.script(model).save(path), trained like the built-in ones.
#pragma once

#include <torch/nn/cloneable.h>

#include <memory>
#include <string>

#include "worker/models/models.h"

namespace torch::jit {
struct Module;
}

namespace ddp::worker {

/// Mirrors the scripted module's parameters and buffers, under their own names and nesting
/// ("conv1.weight", "bn1.running_mean"), as this module's: the Reducer, the optimizer, checkpoints
/// and the export see the very tensors the script computes with, so the export's keys are the
/// Python module's state_dict keys. train()/eval() reach the script. clone() (mode dp) loads the
/// file again and copies the weights.
class TorchScriptImpl : public torch::nn::Cloneable<TorchScriptImpl> {
 public:
  explicit TorchScriptImpl(std::string path);
  void reset() override;
  void train(bool on = true) override;
  at::Tensor forward(at::Tensor x);

 private:
  std::string path_;
  std::shared_ptr<torch::jit::Module> script_;
};
TORCH_MODULE(TorchScript);

/// Loads `path` and checks it fits the data: it has parameters, and its forward takes a batch
/// [2, C, H, W] of `input` and returns float logits [2, input.classes]. ConfigError otherwise, one
/// line naming the file and what to change.
TorchScript loadTorchScriptModel(const std::string& path, const InputSpec& input);

}  // namespace ddp::worker
