// What train.* builds before the first step: the optimizer (plain, fused or ZeRO-sharded), the
// learning-rate schedule over the job's steps, and the autocast dtype of train.precision.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp/lr_schedule.h"
#include "ddp/process_group.h"
#include "worker/config/config.h"

namespace ddp::worker {

/// train.optimizer over `params`, with PyTorch's semantics for each option: ZeRO-sharded over
/// `group` with train.zero, LibTorch's fused kernels (ddp::FusedAdamW, ddp::FusedSGD) when
/// train.fused says so (auto: on a GPU). ConfigError for a fused kernel this LibTorch lacks.
/// `decayMatricesOnly` (model gpt): train.weight_decay applies to the parameters of dim >= 2 (matmul
/// weights, embeddings) and a second group without decay holds the rest (biases, LayerNorm weights),
/// as nanoGPT's configure_optimizers groups them.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const TrainConfig& t, const std::vector<at::Tensor>& params,
                                                       c10::Device device, const ProcessGroup& group,
                                                       bool decayMatricesOnly = false);

/// train.lr_schedule over train.decay_steps, else the job's `jobSteps`. A warm-up that takes the
/// whole run (without train.decay_steps) runs as nanoGPT's: the run's steps rise on the warm-up's
/// line, and rank 0 warns; with train.decay_steps, a warm-up that takes the decay is a ConfigError.
LrSchedule makeSchedule(const TrainConfig& t, int64_t jobSteps, int rank);

/// train.precision → the autocast dtype (kFloat: fp32, no autocast).
at::ScalarType autocastDtype(const std::string& precision);

}  // namespace ddp::worker
