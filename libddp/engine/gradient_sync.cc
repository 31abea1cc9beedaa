#include "libddp/engine/gradient_sync.h"

#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>

#include "libddp/flat_tensors.h"

namespace ddp::engine {

void allReduceGradients(ProcessGroup& group, const std::vector<at::Tensor>& params, at::Tensor extra) {
  if (group.size() == 1) return;
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> grads;
  grads.reserve(params.size() + 1);
  for (const auto& p : params) {
    if (!p.grad().defined()) {
      // Every rank must send the same layout; a missing gradient is a zero contribution.
      p.mutable_grad() = at::zeros_like(p);
    }
    grads.push_back(p.grad());
  }
  if (extra.defined()) grads.push_back(extra);
  if (grads.empty()) return;
  at::Tensor buffer = flat::flatten(grads);
  buffer.div_(group.size());
  group.allReduce(buffer);
  flat::unflatten(buffer, grads);
}

FlatGradientSync::FlatGradientSync(ProcessGroup group, std::vector<at::Tensor> params)
    : state_(std::make_shared<State>(State{std::move(group), std::move(params)})) {}

void FlatGradientSync::prepareForBackward(const std::vector<at::Tensor>& outputs) {
  // The first armed output that backward reaches queues the all-reduce for the end of that backward
  // (the engine runs queued callbacks before backward() returns); the others then do nothing.
  auto pending = std::make_shared<bool>(true);
  std::weak_ptr<State> weak = state_;
  for (const auto& output : outputs) {
    if (!output.requires_grad()) continue;
    at::Tensor tensor = output;
    tensor.register_hook([pending, weak](const at::Tensor&) {
      if (!*pending) return;
      *pending = false;
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto state = weak.lock()) allReduceGradients(state->group, state->params);
      });
    });
  }
}

void FlatGradientSync::reduceWithoutBackward() { allReduceGradients(state_->group, state_->params); }

}  // namespace ddp::engine
