#include "worker/train/optimizer_setup.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/error.h"
#include "ddp/fused_optim.h"
#include "ddp/zero_redundancy_optimizer.h"

namespace ddp::worker {

namespace {

// train.optimizer over `params`, with PyTorch's semantics for each option; with LibTorch's fused
// kernels (ddp::FusedAdamW, ddp::FusedSGD) when train.fused says so (auto: on a GPU).
std::unique_ptr<torch::optim::Optimizer> optimizerOver(const TrainConfig& t, const std::vector<at::Tensor>& params,
                                                       c10::Device device, const ProcessGroup& group) {
  if (t.zero && group.size() > 1) {  // train.zero: the same optimizer, its state sharded over the ranks
    if (t.optimizer == "adamw") {
      return std::make_unique<ZeroRedundancyOptimizer>(
          params, group, torch::optim::AdamWOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
    }
    if (t.optimizer == "adam") {
      return std::make_unique<ZeroRedundancyOptimizer>(
          params, group, torch::optim::AdamOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
    }
    return std::make_unique<ZeroRedundancyOptimizer>(
        params, group, torch::optim::SGDOptions(t.lr).momentum(t.momentum).weight_decay(t.weightDecay).nesterov(t.nesterov));
  }
  const bool adam = t.optimizer == "adamw" || t.optimizer == "adam";
  const bool fused = adam && (t.fused == "true" || (t.fused == "auto" && device.is_cuda() &&
                                                    FusedAdamW::available(device.type())));
  if (fused) {
    if (!FusedAdamW::available(device.type())) {
      DDP_THROW(ConfigError, "config: 'train.fused' is true but this LibTorch has no fused Adam kernel for ",
                device.str(), " (LibTorch 2.x has, on CUDA and CPU); use train.fused: auto");
    }
    FusedAdamWOptions o;
    o.lr = t.lr;
    o.beta1 = t.betas[0];
    o.beta2 = t.betas[1];
    o.eps = t.eps;
    o.weightDecay = t.weightDecay;
    o.decoupledWeightDecay = t.optimizer == "adamw";
    return std::make_unique<FusedAdamW>(params, o);
  }
  if (t.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
  }
  if (t.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
  }
  const auto sgdOptions =
      torch::optim::SGDOptions(t.lr).momentum(t.momentum).weight_decay(t.weightDecay).nesterov(t.nesterov);
  // SGD as torch.optim.SGD(fused=True) (ddp::FusedSGD): one kernel for every parameter instead of a
  // few per parameter, a step the GPU's non-finite flag can skip in the kernel.
  if (t.fused == "true" || (t.fused == "auto" && device.is_cuda() && FusedSGD::available(device.type()))) {
    if (!FusedSGD::available(device.type())) {
      DDP_THROW(ConfigError, "config: 'train.fused' is true but this LibTorch has no fused SGD kernel for ",
                device.str(), " (LibTorch 2.x has, on CUDA and CPU); use train.fused: auto");
    }
    return std::make_unique<FusedSGD>(params, sgdOptions);
  }
  return std::make_unique<torch::optim::SGD>(params, sgdOptions);
}

// The same options as `group`'s, without weight decay.
std::unique_ptr<torch::optim::OptimizerOptions> withoutWeightDecay(const torch::optim::OptimizerParamGroup& group) {
  auto options = group.options().clone();
  if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(options.get())) o->weight_decay(0);
  else if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(options.get())) o->weight_decay(0);
  else if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(options.get())) o->weight_decay(0);
  else DDP_THROW(Error, "makeOptimizer: no weight decay to switch off in this optimizer's options");
  return options;
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const TrainConfig& t, const std::vector<at::Tensor>& params,
                                                       c10::Device device, const ProcessGroup& group,
                                                       bool decayMatricesOnly) {
  if (!decayMatricesOnly || t.weightDecay == 0) return optimizerOver(t, params, device, group);
  std::vector<at::Tensor> decay;
  std::vector<at::Tensor> noDecay;
  for (const auto& p : params) (p.dim() >= 2 ? decay : noDecay).push_back(p);
  auto optimizer = optimizerOver(t, decay, device, group);  // train.zero: partitions the second group too
  if (!noDecay.empty()) {
    optimizer->add_param_group(torch::optim::OptimizerParamGroup(noDecay, withoutWeightDecay(optimizer->param_groups().front())));
  }
  return optimizer;
}

// train.lr_schedule over train.decay_steps, else the job's `jobSteps`. With train.decay_steps set
// the run is one part of a longer schedule (split by max_steps, resumed): its warm-up is measured
// against that schedule, not this part. A warm-up as long as the run (a short try of a long
// recipe: train.max_steps=5 with warmup_steps 50) takes the run's steps on the warm-up's line, as
// nanoGPT's get_lr does; `rank` 0 says so once (-1: nobody, the run takes no step).
LrSchedule makeSchedule(const TrainConfig& t, int64_t jobSteps, int rank) {
  int64_t totalSteps = t.decaySteps > 0 ? t.decaySteps : jobSteps;
  if (t.decaySteps == 0 && t.warmupSteps > 0 && t.warmupSteps >= jobSteps) {
    if (rank == 0) {
      const double last = t.lr * static_cast<double>(jobSteps) / static_cast<double>(t.warmupSteps + 1);
      spdlog::warn("train.warmup_steps is {} but the run has {} optimizer steps: the learning rate only rises, to "
                   "{:.4g} at the last step (train.lr {:.4g} is reached at step {}), as nanoGPT's get_lr does; set "
                   "train.decay_steps to the whole schedule's steps if this run is its first part",
                   t.warmupSteps, jobSteps, last, t.lr, t.warmupSteps);
    }
    totalSteps = t.warmupSteps + 1;  // the decay begins after the run ends
  }
  if ((t.lrSchedule == LrDecay::kCosine || t.lrSchedule == LrDecay::kLinear) && t.warmupSteps >= totalSteps) {
    DDP_THROW(ConfigError, "config: 'train.warmup_steps' is ", t.warmupSteps, " but train.decay_steps is ",
              totalSteps, "; the decay must end after the warm-up");
  }
  LrScheduleOptions o;
  o.kind = t.lrSchedule;
  o.baseLr = t.lr;
  o.warmupSteps = t.warmupSteps;
  o.totalSteps = totalSteps;
  o.minLr = t.minLr;
  o.stepSize = std::max<int64_t>(1, t.stepSize);
  o.gamma = t.gamma;
  o.holdMinLr = true;  // train.decay_steps shorter than the run: min_lr after it, as nanoGPT's get_lr
  return LrSchedule(o);
}

// train.precision → the autocast dtype (kFloat: none).
at::ScalarType autocastDtype(const std::string& precision) {
  if (precision == "bf16") return at::kBFloat16;
  if (precision == "fp16") return at::kHalf;
  return at::kFloat;
}

}  // namespace ddp::worker
