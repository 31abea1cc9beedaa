// Activation checkpointing: a custom autograd function whose forward runs the block without grad
// and whose backward runs it again with grad, then differentiates that. Unlike PyTorch's reentrant
// checkpoint (which calls backward() inside backward, accumulating into .grad behind the engine's
// back), the parameters are inputs of the node: their gradients leave it as outputs, so the outer
// backward accumulates them and runs DDP's and FSDP's hooks as for any other node.
#include "ddp/activation_checkpoint.h"

#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <unordered_set>
#include <vector>

#include "common/error.h"
#include "libddp/checkpoint/optimizer_state.h"
#include "libddp/torch_compat_autocast.h"

namespace ddp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kFloat;
};

// What the forward recorded for the recompute, held by the node (an IValue capsule).
struct Recompute : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> fn;
  std::vector<at::Tensor> params;   // the owner's parameters that require grad: the node's inputs 1..
  std::vector<at::Tensor> buffers;  // put back after the recompute
  bool preserveRng = true;
  at::Tensor cpuRng, deviceRng;
  c10::Device device{c10::kCPU};
  AutocastState cpuAutocast, deviceAutocast;
};

AutocastState autocastOf(c10::DeviceType type) {
  return {compat::autocastEnabled(type), compat::autocastDtype(type)};
}

// Sets a state for a scope, and gives the previous one back at its end.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType type, const AutocastState& state) : type_(type), saved_(autocastOf(type)) {
    set(state);
  }
  ~AutocastScope() { set(saved_); }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  void set(const AutocastState& s) const {
    compat::setAutocastEnabled(type_, s.enabled);
    compat::setAutocastDtype(type_, s.dtype);
  }
  c10::DeviceType type_;
  AutocastState saved_;
};

// torch.random.fork_rng: the forward's generator states for the recompute, the current ones after.
class RngScope {
 public:
  explicit RngScope(const Recompute& r) : r_(r) {
    if (!r_.preserveRng) return;
    cpu_ = checkpoint::cpuRngState();
    device_ = checkpoint::cudaRngState(r_.device);
    checkpoint::setCpuRngState(r_.cpuRng);
    checkpoint::setCudaRngState(r_.device, r_.deviceRng);
  }
  ~RngScope() {
    if (!r_.preserveRng) return;
    checkpoint::setCpuRngState(cpu_);
    checkpoint::setCudaRngState(r_.device, device_);
  }
  RngScope(const RngScope&) = delete;
  RngScope& operator=(const RngScope&) = delete;

 private:
  const Recompute& r_;
  at::Tensor cpu_, device_;
};

// The owner's buffers as they were at its start (running statistics the recompute updates again).
class BuffersScope {
 public:
  explicit BuffersScope(const std::vector<at::Tensor>& buffers) : buffers_(buffers) {
    c10::NoGradGuard noGrad;
    for (const auto& b : buffers_) before_.push_back(b.clone());
  }
  ~BuffersScope() {
    c10::NoGradGuard noGrad;
    for (size_t i = 0; i < before_.size(); ++i) buffers_[i].copy_(before_[i]);
  }
  BuffersScope(const BuffersScope&) = delete;
  BuffersScope& operator=(const BuffersScope&) = delete;

 private:
  const std::vector<at::Tensor>& buffers_;
  std::vector<at::Tensor> before_;
};

// The leaves the recomputed graph accumulates into must be the input and the owner's parameters:
// any other's gradient would be computed by nobody.
void checkLeaves(const at::Tensor& out, const at::Tensor& input, const std::vector<at::Tensor>& params) {
  std::unordered_set<const void*> known{input.unsafeGetTensorImpl()};
  for (const auto& p : params) known.insert(p.unsafeGetTensorImpl());
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (out.grad_fn()) todo.push_back(out.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      if (known.count(leaf->variable.unsafeGetTensorImpl()) == 0) {
        DDP_THROW(ConfigError, "ddp::activationCheckpoint: the function uses a tensor that requires grad (shape ",
                  leaf->variable.sizes(), ") and is not a parameter of the owner module: its gradient would be "
                  "lost; pass as owner the module that holds every parameter the function uses");
      }
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) todo.push_back(edge.function.get());
    }
  }
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, const c10::IValue& state, const at::Tensor& input,
                            at::TensorList /*params: inputs for their edges only*/) {
    ctx->saved_data["recompute"] = state;
    ctx->save_for_backward({input});
    const auto& r = static_cast<const Recompute&>(*state.toCapsule());
    return r.fn(input);  // autograd is off in a Function's forward: nothing is kept
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = ctx->saved_data["recompute"].toCapsule();
    auto& r = static_cast<Recompute&>(*holder);
    const at::Tensor saved = ctx->get_saved_variables()[0];
    variable_list out(2 + r.params.size());  // state, input, parameters
    if (!grads[0].defined()) return out;
    const at::Tensor input = saved.detach().requires_grad_(saved.requires_grad());
    // Put back after the recomputed graph's backward, which may read them (batch norm's).
    const BuffersScope buffers(r.buffers);
    at::Tensor output;
    {
      RngScope rng(r);
      AutocastScope cpu(c10::kCPU, r.cpuAutocast);
      AutocastScope device(r.device.type(), r.deviceAutocast);
      at::AutoGradMode grad(true);
      output = r.fn(input);
    }
    if (!output.requires_grad()) return out;
    checkLeaves(output, input, r.params);
    variable_list wrt;
    if (input.requires_grad()) wrt.push_back(input);
    wrt.insert(wrt.end(), r.params.begin(), r.params.end());
    const variable_list g = torch::autograd::grad({output}, wrt, {grads[0]}, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
    size_t k = 0;
    if (input.requires_grad()) out[1] = g[k++];
    for (size_t i = 0; i < r.params.size(); ++i) out[2 + i] = g[k++];
    return out;
  }
};

at::Tensor checkpointOver(const std::vector<torch::nn::Module*>& owners,
                          const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                          const ActivationCheckpointOptions& options) {
  auto r = c10::make_intrusive<Recompute>();
  for (torch::nn::Module* owner : owners) {
    for (const auto& p : owner->parameters()) {
      if (p.requires_grad()) r->params.push_back(p);
    }
    for (const auto& b : owner->buffers()) r->buffers.push_back(b);
  }
  const bool needsGrad = input.requires_grad() || !r->params.empty();
  if (!at::GradMode::is_enabled() || !needsGrad) return fn(input);
  r->fn = fn;
  r->preserveRng = options.preserveRngState;
  r->device = input.device();
  if (r->preserveRng) {
    r->cpuRng = checkpoint::cpuRngState();
    r->deviceRng = checkpoint::cudaRngState(r->device);
  }
  r->cpuAutocast = autocastOf(c10::kCPU);
  r->deviceAutocast = autocastOf(r->device.type());
  const std::vector<at::Tensor> params = r->params;
  return CheckpointFunction::apply(c10::IValue::make_capsule(std::move(r)), input, at::TensorList(params));
}

}  // namespace

at::Tensor activationCheckpoint(torch::nn::Module& owner, const std::function<at::Tensor(const at::Tensor&)>& fn,
                                const at::Tensor& input, const ActivationCheckpointOptions& options) {
  if (!fn) DDP_THROW(ConfigError, "ddp::activationCheckpoint: the function is empty");
  return checkpointOver({&owner}, fn, input, options);
}

at::Tensor activationCheckpointSequential(torch::nn::SequentialImpl& sequential, int64_t segments,
                                          const at::Tensor& input, const ActivationCheckpointOptions& options) {
  const auto n = static_cast<int64_t>(sequential.size());
  if (segments < 1 || segments > n) {
    DDP_THROW(ConfigError, "ddp::activationCheckpointSequential: ", segments, " segments for ", n,
              " modules; give 1 to ", n);
  }
  // checkpoint_sequential's cut: segments - 1 runs of n / segments modules, checkpointed; the rest plain.
  const int64_t size = n / segments;
  auto run = [&sequential](int64_t first, int64_t last) {
    return [&sequential, first, last](const at::Tensor& x) {
      at::Tensor y = x;
      for (int64_t i = first; i < last; ++i) y = (sequential.begin() + i)->forward(y);
      return y;
    };
  };
  at::Tensor x = input;
  int64_t start = 0;
  for (; start < size * (segments - 1); start += size) {
    std::vector<torch::nn::Module*> owners;
    for (int64_t i = start; i < start + size; ++i) owners.push_back(sequential.ptr(static_cast<size_t>(i)).get());
    x = checkpointOver(owners, run(start, start + size), x, options);
  }
  return run(start, n)(x);
}

}  // namespace ddp
