// ddp::ZeroRedundancyOptimizer: ZeRO stage 1 (torch.distributed.optim.ZeroRedundancyOptimizer's
// twin): each rank keeps the optimizer state of its own shard of the parameters only, steps that
// shard, and broadcasts it to the others.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

namespace detail {
template <typename Options>
struct OptimizerOf;
template <>
struct OptimizerOf<torch::optim::SGDOptions> { using type = torch::optim::SGD; };
template <>
struct OptimizerOf<torch::optim::AdamOptions> { using type = torch::optim::Adam; };
template <>
struct OptimizerOf<torch::optim::AdamWOptions> { using type = torch::optim::AdamW; };
}  // namespace detail

/// `ddp::ZeroRedundancyOptimizer opt(model->parameters(), group, torch::optim::AdamWOptions(1e-3));`
/// (`ZeroRedundancyOptimizer(params, optimizer_class=AdamW, lr=1e-3)`): a torch::optim::Optimizer
/// whose param_groups() hold every parameter with your options (an lr schedule sets them as for
/// any optimizer), while the state lives in a local optimizer of the same class over this rank's
/// shard: PyTorch's greedy partition (largest parameters first, each to the rank with the fewest
/// elements so far). step(): the shard's step, then every rank broadcasts its shard (one coalesced
/// broadcast per rank). zero_grad() clears every gradient. Collective: every rank steps together;
/// gradients must be equal on every rank (as DDP leaves them). The result equals the unsharded
/// optimizer's, with about 1/size() of its state per rank. ConfigError for parameters of a
/// ddp::fullyShard unit (each rank holds other rows; the unit shards their state already).
class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  /// The local optimizer over one shard: its parameter groups mirror param_groups() (possibly empty).
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::optim::OptimizerParamGroup>)>;

  /// torch::optim::SGDOptions, AdamOptions or AdamWOptions: the optimizer class follows.
  template <typename Options, typename Optim = typename detail::OptimizerOf<Options>::type>
  ZeroRedundancyOptimizer(const std::vector<at::Tensor>& params, ProcessGroup group, const Options& options)
      : ZeroRedundancyOptimizer(params, std::move(group), std::make_unique<Options>(options),
                                [options](std::vector<torch::optim::OptimizerParamGroup> groups) {
                                  return std::make_unique<Optim>(std::move(groups), options);
                                }) {}
  /// Any optimizer class: `make` builds it over the shard's parameter groups.
  ZeroRedundancyOptimizer(const std::vector<at::Tensor>& params, ProcessGroup group,
                          std::unique_ptr<torch::optim::OptimizerOptions> defaults, Factory make);
  /// Parameter groups, as PyTorch's `ZeroRedundancyOptimizer([{"params": decay, "weight_decay": 0.1},
  /// {"params": rest, "weight_decay": 0.0}], optimizer_class=AdamW, ...)`: a group without options
  /// takes `options`. Every group is partitioned in order, the sizes carried from group to group
  /// (PyTorch's _partition_parameters). add_param_group() after construction works as PyTorch's
  /// too: the new group is partitioned (the earlier ones keep their owners) at the next step(),
  /// owner(), owns() or localOptimizer().
  template <typename Options, typename Optim = typename detail::OptimizerOf<Options>::type>
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups, ProcessGroup group,
                          const Options& options)
      : ZeroRedundancyOptimizer(std::move(groups), std::move(group), std::make_unique<Options>(options),
                                [options](std::vector<torch::optim::OptimizerParamGroup> shardGroups) {
                                  return std::make_unique<Optim>(std::move(shardGroups), options);
                                }) {}
  /// Parameter groups with any optimizer class.
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups, ProcessGroup group,
                          std::unique_ptr<torch::optim::OptimizerOptions> defaults, Factory make);
  ~ZeroRedundancyOptimizer() override;

  at::Tensor step(LossClosure closure = nullptr) override;

  /// The ranks' shards: owner(i) is the rank that steps the i-th parameter of param_groups(),
  /// counted over the groups in order.
  int owner(size_t parameterIndex) const;
  /// This rank's local optimizer (its state is this rank's shard only).
  torch::optim::Optimizer& localOptimizer();
  /// Bytes of optimizer state this rank holds (SGD's, Adam's and AdamW's tensors; -1 for others).
  int64_t localStateBytes() const;

  /// Whether this rank steps `param` (holds its state).
  bool owns(const at::Tensor& param) const;
  /// ddp::Checkpointer gathers every rank's shard of the state into the checkpoint rank 0 writes
  /// (the unsharded optimizer's names: "momentum_buffer.<name>", "exp_avg.<name>", ...), and on
  /// resume each rank takes its shard's entries back (SGD, Adam, AdamW): resume is exact at the
  /// same world size, and the file reads in PyTorch as an unsharded optimizer's.

 private:
  // Partitions the groups added since the last call (add_param_group) and gives this rank's part
  // of each to the local optimizer.
  void partitionNewGroups() const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Bytes of optimizer state this process holds: SGD's momentum buffers, Adam's and AdamW's moments
/// (FusedAdamW's too), a ZeroRedundancyOptimizer's shard only; -1 for a state it does not know.
int64_t optimizerStateBytes(const torch::optim::Optimizer& optimizer);

}  // namespace ddp
