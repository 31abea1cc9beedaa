#include "comm/gradient_sync.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>

#include "common/error.h"

namespace ddp::comm {
namespace {

// Flattens into one contiguous buffer so a step costs one collective.
at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void unflatten(const at::Tensor& buffer, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(buffer.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
}

}  // namespace

void broadcastTensors(Communicator& comm, const std::vector<at::Tensor>& tensors, const BroadcastOptions& options) {
  if (comm.size() == 1 || tensors.empty()) return;
  c10::NoGradGuard noGrad;
  at::Tensor buffer = flatten(tensors);
  comm.broadcast(buffer, options)->wait();
  unflatten(buffer, tensors);
}

void allReduceGradients(Communicator& comm, const std::vector<at::Tensor>& params,
                        at::Tensor extra) {
  if (comm.size() == 1) return;
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
  at::Tensor buffer = flatten(grads);
  buffer.div_(comm.size());
  comm.allReduce(buffer)->wait();
  unflatten(buffer, grads);
}

FlatGradientSync::FlatGradientSync(Communicator& comm, std::vector<at::Tensor> params)
    : state_(std::make_shared<State>(State{comm, std::move(params)})) {}

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
        if (auto state = weak.lock()) allReduceGradients(state->comm, state->params);
      });
    });
  }
}

void FlatGradientSync::reduceWithoutBackward() { allReduceGradients(state_->comm, state_->params); }

}  // namespace ddp::comm
