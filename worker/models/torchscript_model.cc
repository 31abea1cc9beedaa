#include "worker/models/torchscript_model.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/script.h>

#include "common/error.h"

namespace ddp::worker {
namespace {

void mirror(torch::nn::Module& ours, const torch::jit::Module& theirs) {
  for (const auto& p : theirs.named_parameters(/*recurse=*/false)) {
    ours.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : theirs.named_buffers(/*recurse=*/false)) ours.register_buffer(b.name, b.value);
  for (const auto& child : theirs.named_children()) {
    auto sub = std::make_shared<torch::nn::Module>(child.name);
    mirror(*sub, child.value);
    ours.register_module(child.name, sub);
  }
}

std::string shapeOf(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

}  // namespace

TorchScriptImpl::TorchScriptImpl(std::string path) : path_(std::move(path)) { reset(); }

void TorchScriptImpl::reset() {
  try {
    script_ = std::make_shared<torch::jit::Module>(torch::jit::load(path_, c10::Device(c10::kCPU)));
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    DDP_THROW(ConfigError, "config: 'model.path' '", path_, "' is not a TorchScript file (", what.substr(0, what.find_first_of(".\n")),
              "); save one in Python with torch.jit.script(model).save(path)");
  }
  script_->train(is_training());
  mirror(*this, *script_);
}

void TorchScriptImpl::train(bool on) {
  torch::nn::Module::train(on);
  if (script_) script_->train(on);
}

at::Tensor TorchScriptImpl::forward(at::Tensor x) {
  const c10::IValue out = script_->forward({std::move(x)});
  if (!out.isTensor()) {
    DDP_THROW(ConfigError, "config: the TorchScript model '", path_, "' returns a ", out.tagKind(),
              ", not a tensor of logits [N, classes]");
  }
  return out.toTensor();
}

TorchScript loadTorchScriptModel(const std::string& path, const InputSpec& input) {
  TorchScript model(path);
  if (model->parameters().empty()) {
    DDP_THROW(ConfigError, "config: the TorchScript model '", path, "' has no parameters, so there is nothing to train; "
              "script a module with layers");
  }
  // One dry run on a batch of two: the output must be the logits the loss takes.
  c10::NoGradGuard noGrad;
  model->eval();
  at::Tensor out;
  try {
    out = model->forward(at::zeros({2, input.channels, input.height, input.width}));
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    DDP_THROW(ConfigError, "config: the TorchScript model '", path, "' fails on a batch [2, ", input.channels, ", ",
              input.height, ", ", input.width, "] of the data (", what.substr(0, what.find('\n')), ")");
  }
  model->train();
  if (out.dim() != 2 || out.size(0) != 2 || out.size(1) != input.classes || !out.is_floating_point()) {
    DDP_THROW(ConfigError, "config: the TorchScript model '", path, "' returns ", shapeOf(out), " for a batch of 2, but ",
              "the loss needs float logits [2, ", input.classes, "] (", input.classes,
              " classes in the data); change its last layer");
  }
  return model;
}

}  // namespace ddp::worker
