// ddp::SyncBatchNorm: torch.nn.SyncBatchNorm for C++ (LibTorch has none): batch statistics over
// every rank's part of the batch, so N ranks with batch B train BatchNorm as one process with N*B.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <ostream>

#include "ddp/process_group.h"

namespace ddp {

/// BatchNorm over the whole data-parallel batch (torch.nn.SyncBatchNorm). In training, each rank's
/// per-channel mean, variance and count are gathered from every rank and merged count-weighted
/// (Chan's parallel variance: uneven local batches and empty ones are right), the input is
/// normalised with the global statistics, the running statistics are updated as PyTorch does
/// (unbiased variance of the whole batch), and backward all-reduces the two per-channel gradient
/// sums. In eval mode, in a group of one, or without track_running_stats in eval, it is BatchNorm.
///
/// Parameters and buffers have BatchNorm's names (weight, bias, running_mean, running_var,
/// num_batches_tracked): checkpoints and exports load into either. Input: (N, C, ...) with any
/// number of trailing dimensions, as Python's SyncBatchNorm (1d, 2d and 3d alike).
///
/// Every rank must run the layer's forward and backward (they are collectives): evaluate through
/// eval() or on every rank. Its collectives run on the group's communicator, in the order autograd
/// reaches them, which is the same on every rank for the same model.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, ProcessGroup group);
  SyncBatchNormImpl(int64_t numFeatures, ProcessGroup group)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(numFeatures), std::move(group)) {}
  /// Takes `batchNorm`'s parameters and buffers (the same tensors, so an optimizer holding them goes
  /// on working) instead of new ones; `batchNorm` has BatchNorm's names. convertSyncBatchNorm uses it.
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, ProcessGroup group,
                    const torch::nn::Module& shareTensorsOf);

  torch::Tensor forward(const torch::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  torch::nn::BatchNormOptions options;
  torch::Tensor weight;
  torch::Tensor bias;
  torch::Tensor running_mean;
  torch::Tensor running_var;
  torch::Tensor num_batches_tracked;

 private:
  ProcessGroup group_;
  const torch::nn::Module* shareFrom_ = nullptr;  // only while the sharing constructor runs
};

TORCH_MODULE(SyncBatchNorm);

/// Functional SyncBatchNorm in training mode (what the module calls): normalises `input` (N, C, ...)
/// with the statistics of the whole batch across `group`, updates `runningMean`/`runningVar` (if
/// defined) with `momentum`. `weight`/`bias` may be undefined (no affine).
torch::Tensor syncBatchNorm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                            const torch::Tensor& runningMean, const torch::Tensor& runningVar, double momentum,
                            double eps, ProcessGroup& group);

/// SyncBatchNorm.convert_sync_batchnorm: replaces every torch::nn::BatchNorm{1,2,3}d registered in
/// `module` (recursively) by a SyncBatchNorm sharing its parameters and buffers (an optimizer made
/// before keeps working) and its training mode. Returns how many were replaced.
///
/// C++ cannot redirect a layer a parent holds in a member (`torch::nn::BatchNorm2d bn;` called as
/// `bn(x)`) or inside a Sequential/ModuleList: those would keep calling the old layer, so each is a
/// ConfigError naming it (declare it as ddp::SyncBatchNorm instead). Layers a parent calls through
/// its registry (`named_children()`, `children()`) are replaced.
int convertSyncBatchNorm(torch::nn::Module& module, const ProcessGroup& group);

}  // namespace ddp
