// ddp::FusedAdamW: torch/optim/adam.py's _fused_adam for LibTorch (one fused kernel per device and
// dtype; the step counts kept as float32 tensors, incremented before the kernel and decremented by
// found_inf after it, as Python does).
#include "ddp/fused_optim.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "libddp/torch_compat.h"
#if DDP_TORCH_2
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#endif
#include <torch/optim/sgd.h>

#include <optional>

namespace ddp {
namespace {

std::unique_ptr<torch::optim::AdamWOptions> defaultsOf(const FusedAdamWOptions& o) {
  return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o.lr)
                                                          .betas({o.beta1, o.beta2})
                                                          .eps(o.eps)
                                                          .weight_decay(o.weightDecay)
                                                          .amsgrad(o.amsgrad));
}

}  // namespace

bool FusedAdamW::available(c10::DeviceType deviceType) {
  if (deviceType == c10::DeviceType::CUDA) return DDP_TORCH_2;  // 1.13 has no _fused_adamw_
  return deviceType == c10::DeviceType::CPU && DDP_TORCH_2;     // CPU kernels since 2.4
}

FusedAdamW::FusedAdamW(const std::vector<at::Tensor>& params, FusedAdamWOptions options)
    : torch::optim::Optimizer(std::vector<at::Tensor>(params), defaultsOf(options)),
      decoupled_(options.decoupledWeightDecay) {
  if (!(options.lr >= 0)) DDP_THROW(ConfigError, "ddp::FusedAdamW: lr must be >= 0 (got ", options.lr, ")");
  if (!(options.eps >= 0)) DDP_THROW(ConfigError, "ddp::FusedAdamW: eps must be >= 0 (got ", options.eps, ")");
  for (double b : {options.beta1, options.beta2}) {
    if (!(b >= 0 && b < 1)) DDP_THROW(ConfigError, "ddp::FusedAdamW: betas must be in [0, 1) (got ", b, ")");
  }
  if (!(options.weightDecay >= 0)) {
    DDP_THROW(ConfigError, "ddp::FusedAdamW: weightDecay must be >= 0 (got ", options.weightDecay, ")");
  }
  for (const auto& p : params) {
    if (!available(p.device().type())) {
      DDP_THROW(ConfigError, "ddp::FusedAdamW: this LibTorch has no fused Adam kernel for ", p.device().str(),
                " parameters (it needs LibTorch 2.x, on CUDA or CPU); use torch::optim::AdamW");
    }
    if (!p.is_floating_point()) DDP_THROW(ConfigError, "ddp::FusedAdamW: parameters must be floating point");
  }
}

const FusedAdamWState* FusedAdamW::stateOf(const at::Tensor& param) const {
  auto it = states_.find(param.unsafeGetTensorImpl());
  return it == states_.end() ? nullptr : &it->second;
}

void FusedAdamW::setStateOf(const at::Tensor& param, FusedAdamWState state) {
  states_[param.unsafeGetTensorImpl()] = std::move(state);
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable(true);
    loss = closure();
  }
  step(at::Tensor(), at::Tensor());
  return loss;
}

void FusedAdamW::step(const at::Tensor& gradScale, const at::Tensor& foundInf) { step(gradScale, foundInf, at::Tensor()); }

void FusedAdamW::step(const at::Tensor& gradScale, const at::Tensor& foundInf, const at::Tensor& lr) {
#if DDP_TORCH_2
  c10::NoGradGuard noGrad;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // Python's _group_tensors_by_device_and_dtype: one kernel call per (device, dtype).
    struct Lists {
      c10::Device device;
      at::ScalarType dtype;
      std::vector<at::Tensor> params, grads, expAvgs, expAvgSqs, maxExpAvgSqs, steps;
    };
    std::vector<Lists> lists;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& st = states_[p.unsafeGetTensorImpl()];
      if (!st.step.defined()) {  // Python's _init_group for fused: float32 step on the parameter's device
        st.step = at::zeros({}, p.options().dtype(at::kFloat));
        st.expAvg = at::zeros_like(p, at::MemoryFormat::Preserve);
        st.expAvgSq = at::zeros_like(p, at::MemoryFormat::Preserve);
        if (o.amsgrad()) st.maxExpAvgSq = at::zeros_like(p, at::MemoryFormat::Preserve);
      }
      auto it = std::find_if(lists.begin(), lists.end(), [&](const Lists& l) {
        return l.device == p.device() && l.dtype == p.scalar_type();
      });
      if (it == lists.end()) it = lists.insert(lists.end(), Lists{p.device(), p.scalar_type(), {}, {}, {}, {}, {}, {}});
      it->params.push_back(p);
      it->grads.push_back(p.grad());
      it->expAvgs.push_back(st.expAvg);
      it->expAvgSqs.push_back(st.expAvgSq);
      if (o.amsgrad()) it->maxExpAvgSqs.push_back(st.maxExpAvgSq);
      it->steps.push_back(st.step);
    }
    const auto [beta1, beta2] = o.betas();
    for (auto& l : lists) {
      std::optional<at::Tensor> scale, inf;
      if (gradScale.defined()) scale = gradScale.to(l.device, /*non_blocking=*/true);
      if (foundInf.defined()) inf = foundInf.to(l.device, /*non_blocking=*/true);
      at::_foreach_add_(l.steps, 1);
      if (lr.defined()) {  // the learning rate read on the device (CUDA graphs replay it)
        const at::Tensor deviceLr = lr.to(l.device, /*non_blocking=*/true);
        if (decoupled_) {
          at::_fused_adamw_(l.params, l.grads, l.expAvgs, l.expAvgSqs, l.maxExpAvgSqs, l.steps, deviceLr, beta1, beta2,
                            o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, scale, inf);
        } else {
          at::_fused_adam_(l.params, l.grads, l.expAvgs, l.expAvgSqs, l.maxExpAvgSqs, l.steps, deviceLr, beta1, beta2,
                           o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, scale, inf);
        }
      } else if (decoupled_) {
        at::_fused_adamw_(l.params, l.grads, l.expAvgs, l.expAvgSqs, l.maxExpAvgSqs, l.steps, o.lr(), beta1, beta2,
                          o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, scale, inf);
      } else {
        at::_fused_adam_(l.params, l.grads, l.expAvgs, l.expAvgSqs, l.maxExpAvgSqs, l.steps, o.lr(), beta1, beta2,
                         o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, scale, inf);
      }
      if (inf) at::_foreach_sub_(l.steps, std::vector<at::Tensor>(l.steps.size(), *inf));
    }
  }
#else
  (void)gradScale;
  (void)foundInf;
  (void)lr;
  DDP_THROW(ConfigError, "ddp::FusedAdamW needs LibTorch 2.x");
#endif
}

bool fusedSgdAvailable() { return DDP_TORCH_2; }

void fusedSgdStep(torch::optim::SGD& sgd, const at::Tensor& lr, const at::Tensor& foundInf) {
  fusedSgdStep(sgd, lr, foundInf, at::Tensor());
}

void fusedSgdStep(torch::optim::SGD& sgd, const at::Tensor& lr, const at::Tensor& foundInf, const at::Tensor& gradScale) {
#if DDP_TORCH_2
  c10::NoGradGuard noGrad;
  auto& state = sgd.state();
  for (auto& group : sgd.param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    struct Lists {
      c10::Device device;
      at::ScalarType dtype;
      std::vector<at::Tensor> params, grads, buffers;
      bool firstStep = false;
    };
    std::vector<Lists> lists;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) {
        DDP_THROW(ConfigError, "ddp::FusedSGD: a gradient is sparse; the fused kernel takes dense gradients "
                  "(as torch.optim.SGD(fused=True)); use torch::optim::SGD");
      }
      // LibTorch's SGD keeps the buffer in its state (checkpoints save it); a parameter's first step
      // makes it, as torch.optim.SGD's first step does (buffer = gradient: the kernel's
      // is_first_step). Parameters with and without a buffer go in separate lists: is_first_step
      // would start every buffer of its list anew.
      torch::optim::SGDParamState* param = nullptr;
      bool firstStep = false;
      if (o.momentum() != 0) {
        auto& slot = state[compat::optimizerStateKey(p)];
        if (!slot) slot = std::make_unique<torch::optim::SGDParamState>();
        param = static_cast<torch::optim::SGDParamState*>(slot.get());
        if (!param->momentum_buffer().defined()) {
          param->momentum_buffer(at::zeros_like(p, at::MemoryFormat::Preserve));
          firstStep = true;
        }
      }
      auto it = std::find_if(lists.begin(), lists.end(), [&](const Lists& l) {
        return l.device == p.device() && l.dtype == p.scalar_type() && l.firstStep == firstStep;
      });
      if (it == lists.end()) it = lists.insert(lists.end(), Lists{p.device(), p.scalar_type(), {}, {}, {}, firstStep});
      it->params.push_back(p);
      it->grads.push_back(p.grad());
      if (param != nullptr) it->buffers.push_back(param->momentum_buffer());
    }
    for (auto& l : lists) {
      // torch.optim.SGD with a GradScaler skips a step whose gradients are not finite before it
      // makes a momentum buffer, so the next step starts it (buffer = gradient). The kernel skips
      // but would leave this call's buffers (zeros) behind, and with dampening the next step would
      // make them (1 - dampening) x gradient: this call's new buffers are dropped again (one host
      // read, on a first step with dampening only: such a step cannot be captured in a CUDA graph).
      if (l.firstStep && foundInf.defined() && o.dampening() != 0 && foundInf.item<double>() != 0) {
        for (const auto& p : l.params) state.erase(compat::optimizerStateKey(p));
        continue;
      }
      std::optional<at::Tensor> inf, scale;
      if (foundInf.defined()) inf = foundInf.to(l.device, /*non_blocking=*/true);
      if (gradScale.defined()) scale = gradScale.to(l.device, /*non_blocking=*/true);
      if (lr.defined()) {
        at::_fused_sgd_(l.params, l.grads, l.buffers, o.weight_decay(), o.momentum(),
                        lr.to(l.device, /*non_blocking=*/true), o.dampening(), o.nesterov(), /*maximize=*/false,
                        l.firstStep, scale, inf);
      } else {
        at::_fused_sgd_(l.params, l.grads, l.buffers, o.weight_decay(), o.momentum(), o.lr(), o.dampening(),
                        o.nesterov(), /*maximize=*/false, l.firstStep, scale, inf);
      }
    }
  }
#else
  (void)sgd;
  (void)lr;
  (void)foundInf;
  (void)gradScale;
  DDP_THROW(ConfigError, "ddp::fusedSgdStep needs LibTorch 2.x (torch.optim.SGD(fused=True)'s kernel)");
#endif
}

bool FusedSGD::available(c10::DeviceType deviceType) {
  return fusedSgdAvailable() && (deviceType == c10::DeviceType::CUDA || deviceType == c10::DeviceType::CPU);
}

FusedSGD::FusedSGD(const std::vector<at::Tensor>& params, torch::optim::SGDOptions options)
    : torch::optim::SGD(std::vector<at::Tensor>(params), options) {
  for (const auto& p : params) {
    if (!available(p.device().type())) {
      DDP_THROW(ConfigError, "ddp::FusedSGD: this LibTorch has no fused SGD kernel for ", p.device().str(),
                " parameters (it needs LibTorch 2.x, on CUDA or CPU); use torch::optim::SGD");
    }
    if (!p.is_floating_point()) DDP_THROW(ConfigError, "ddp::FusedSGD: parameters must be floating point");
  }
}

at::Tensor FusedSGD::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable(true);
    loss = closure();
  }
  fusedSgdStep(*this, at::Tensor(), at::Tensor(), at::Tensor());
  return loss;
}

void FusedSGD::step(const at::Tensor& gradScale, const at::Tensor& foundInf, const at::Tensor& lr) {
  fusedSgdStep(*this, lr, foundInf, gradScale);
}

void FusedAdamW::save(torch::serialize::OutputArchive&) const {
  DDP_THROW(CheckpointError, "ddp::FusedAdamW keeps its state by parameter: save it with ddp::Checkpointer");
}

void FusedAdamW::load(torch::serialize::InputArchive&) {
  DDP_THROW(CheckpointError, "ddp::FusedAdamW keeps its state by parameter: load it with ddp::Checkpointer");
}

}  // namespace ddp
