// ddp::ZeroRedundancyOptimizer: torch/distributed/optim/zero_redundancy_optimizer.py's partition
// (_partition_parameters: per group, largest first, each to the rank with the fewest elements),
// local step and _sync_params (every rank broadcasts its shard).
#include "ddp/zero_redundancy_optimizer.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "ddp/fused_optim.h"
#include "libddp/fsdp/sharded_parameter.h"
#include "libddp/internal.h"

namespace ddp {

struct ZeroRedundancyOptimizer::Impl {
  explicit Impl(ProcessGroup g) : group(std::move(g)), shardBroadcast(group.withLabel("ZeroRedundancyOptimizer shards")) {}
  ProcessGroup group;
  ProcessGroup shardBroadcast;  // the group, its collectives named for reports
  std::vector<int> owners;                     // per parameter, flattened over the groups
  std::vector<std::vector<at::Tensor>> shards;  // per rank, its parameters (broadcast order)
  std::vector<int64_t> sizes;                  // per rank, the elements it owns (carried across groups)
  size_t partitionedGroups = 0;                // param_groups() partitioned so far
  std::unique_ptr<torch::optim::Optimizer> local;

  // _partition_parameters for one group: sorted by numel descending (stable, as Python's sorted),
  // each to the rank with the fewest elements so far (the first such rank). Returns this rank's.
  std::vector<at::Tensor> partition(const std::vector<at::Tensor>& ps) {
    std::vector<size_t> order(ps.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ps[a].numel() > ps[b].numel(); });
    std::vector<int> groupOwners(ps.size(), 0);
    for (size_t i : order) {
      const int rank = static_cast<int>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
      groupOwners[i] = rank;
      sizes[static_cast<size_t>(rank)] += ps[i].numel();
    }
    std::vector<at::Tensor> mine;
    for (size_t i = 0; i < ps.size(); ++i) {
      owners.push_back(groupOwners[i]);
      shards[static_cast<size_t>(groupOwners[i])].push_back(ps[i]);
      if (groupOwners[i] == group.rank()) mine.push_back(ps[i]);
    }
    return mine;
  }
};

namespace {

// One group without options: the base class gives it the defaults (no use of `defaults` here, whose
// move into the base may happen first).
std::vector<torch::optim::OptimizerParamGroup> asGroups(const std::vector<at::Tensor>& params) {
  return {torch::optim::OptimizerParamGroup(params)};
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(const std::vector<at::Tensor>& params, ProcessGroup group,
                                                 std::unique_ptr<torch::optim::OptimizerOptions> defaults, Factory make)
    : ZeroRedundancyOptimizer(asGroups(params), std::move(group), std::move(defaults), std::move(make)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                                 ProcessGroup group,
                                                 std::unique_ptr<torch::optim::OptimizerOptions> defaults, Factory make)
    : torch::optim::Optimizer(std::move(groups), std::move(defaults)),
      impl_(std::make_unique<Impl>(std::move(group))) {
  internal::checkLive(impl_->group, "ddp::ZeroRedundancyOptimizer");
  size_t count = 0;
  for (const auto& g : param_groups()) count += g.params().size();
  if (count == 0) DDP_THROW(ConfigError, "ddp::ZeroRedundancyOptimizer: no parameters to optimize");
  if (!make) DDP_THROW(ConfigError, "ddp::ZeroRedundancyOptimizer: no optimizer factory");
  for (const auto& g : param_groups()) {
    for (const auto& p : g.params()) {
      // Each rank holds other rows of a unit's parameters: broadcasting an owner's rows would write
      // them over the others' (wrong weights, silently, where the shards' shapes agree).
      if (const auto shard = fsdp::shardOfParameter(p)) {
        DDP_THROW(ConfigError, "ddp::ZeroRedundancyOptimizer: a parameter of the ddp::fullyShard unit ", shard->unit,
                  " is given; a fully sharded unit already shards its gradients and optimizer state (each rank "
                  "steps its own rows): use a plain optimizer (torch::optim::AdamW, ddp::FusedAdamW) on the sharded model");
      }
    }
  }
  impl_->shards.resize(static_cast<size_t>(impl_->group.size()));
  impl_->sizes.assign(static_cast<size_t>(impl_->group.size()), 0);
  std::vector<torch::optim::OptimizerParamGroup> localGroups;
  for (auto& g : param_groups()) localGroups.emplace_back(impl_->partition(g.params()), g.options().clone());
  impl_->partitionedGroups = param_groups().size();
  impl_->local = make(std::move(localGroups));
  if (!impl_->local) DDP_THROW(ConfigError, "ddp::ZeroRedundancyOptimizer: the factory returned no optimizer");
}

void ZeroRedundancyOptimizer::partitionNewGroups() const {
  const auto& groups = param_groups();
  for (; impl_->partitionedGroups < groups.size(); ++impl_->partitionedGroups) {
    const auto& g = groups[impl_->partitionedGroups];
    impl_->local->add_param_group(torch::optim::OptimizerParamGroup(impl_->partition(g.params()), g.options().clone()));
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable(true);
    loss = closure();
  }
  partitionNewGroups();
  // _local_step: the hyperparameters of param_groups() (an lr schedule's) reach the shard's optimizer.
  auto& mine = impl_->local->param_groups();
  for (size_t g = 0; g < mine.size(); ++g) mine[g].set_options(param_groups()[g].options().clone());
  impl_->local->step();
  // _sync_params: every rank's shard from its owner, one coalesced broadcast per rank.
  c10::NoGradGuard noGrad;
  ProcessGroup& shards = impl_->shardBroadcast;
  for (int r = 0; r < shards.size(); ++r) {
    const std::vector<at::Tensor>& shard = impl_->shards[static_cast<size_t>(r)];
    if (!shard.empty()) shards.broadcast(shard, r);
  }
  return loss;
}

int ZeroRedundancyOptimizer::owner(size_t parameterIndex) const {
  partitionNewGroups();
  if (parameterIndex >= impl_->owners.size()) {
    DDP_THROW(ConfigError, "ddp::ZeroRedundancyOptimizer::owner: parameter ", parameterIndex, " of ",
              impl_->owners.size());
  }
  return impl_->owners[parameterIndex];
}

torch::optim::Optimizer& ZeroRedundancyOptimizer::localOptimizer() {
  partitionNewGroups();
  return *impl_->local;
}

bool ZeroRedundancyOptimizer::owns(const at::Tensor& param) const {
  partitionNewGroups();
  for (const auto& p : impl_->shards[static_cast<size_t>(impl_->group.rank())]) {
    if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return true;
  }
  return false;
}

namespace {

int64_t bytesOf(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

int64_t ZeroRedundancyOptimizer::localStateBytes() const {
  partitionNewGroups();
  return optimizerStateBytes(*impl_->local);
}

int64_t optimizerStateBytes(const torch::optim::Optimizer& optimizer) {
  if (const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer)) return zero->localStateBytes();
  int64_t bytes = 0;
  if (const auto* fused = dynamic_cast<const FusedAdamW*>(&optimizer)) {
    for (const auto& group : fused->param_groups()) {
      for (const auto& p : group.params()) {
        if (const FusedAdamWState* st = fused->stateOf(p)) {
          bytes += bytesOf(st->expAvg) + bytesOf(st->expAvgSq) + bytesOf(st->maxExpAvgSq) + bytesOf(st->step);
        }
      }
    }
    return bytes;
  }
  for (const auto& entry : optimizer.state()) {
    const torch::optim::OptimizerParamState* state = entry.second.get();
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      bytes += bytesOf(sgd->momentum_buffer());
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      bytes += bytesOf(adamw->exp_avg()) + bytesOf(adamw->exp_avg_sq()) + bytesOf(adamw->max_exp_avg_sq());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      bytes += bytesOf(adam->exp_avg()) + bytesOf(adam->exp_avg_sq()) + bytesOf(adam->max_exp_avg_sq());
    } else {
      return -1;  // an optimizer whose state this does not know
    }
  }
  return bytes;
}

}  // namespace ddp
