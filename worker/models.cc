#include "worker/models.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>

#include "common/error.h"

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
    x = layers_[i]->forward(x);
    if (i + 1 < layers_.size()) x = F::relu(x);
  }
  return x;
}

CnnImpl::CnnImpl(const InputSpec& input) : input_(input) { reset(); }

void CnnImpl::reset() {
  DDP_ENFORCE(input_.height % 4 == 0 && input_.width % 4 == 0,
              "the cnn model pools twice by 2; input ", input_.height, "x", input_.width,
              " must be divisible by 4");
  conv1_ = register_module(
      "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(input_.channels, 32, 3).padding(1)));
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
  fc1_ = register_module("fc1", torch::nn::Linear(64 * (input_.height / 4) * (input_.width / 4), 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, input_.classes));
}

at::Tensor CnnImpl::forward(at::Tensor x) {
  x = F::max_pool2d(F::relu(conv1_->forward(x)), F::MaxPool2dFuncOptions(2));
  x = F::max_pool2d(F::relu(conv2_->forward(x)), F::MaxPool2dFuncOptions(2));
  x = F::relu(fc1_->forward(x.flatten(1)));
  return fc2_->forward(x);
}

torch::nn::AnyModule makeModel(const ModelConfig& config, const InputSpec& input) {
  if (config.name == "mlp") return torch::nn::AnyModule(Mlp(input, config.hidden));
  if (config.name == "cnn") return torch::nn::AnyModule(Cnn(input));
  DDP_THROW(ConfigError, "config: 'model.name' is '", config.name, "'; use mlp or cnn");
}

}  // namespace ddp::worker
