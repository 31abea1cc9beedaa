#include "worker/train/fully_sharded.h"

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "worker/train/finite_check.h"

namespace ddp::worker {

FullyShardedParallelism::FullyShardedParallelism(const WorkerConfig& config, const ProcessGroup& group,
                                                 torch::nn::AnyModule& model, const InputSpec& input)
    : config_(config), group_(group), device_(group.device()), model_(model), input_(input) {
  torch::nn::Module& root = *model_.ptr();
  auto* sharded = dynamic_cast<ShardedUnits*>(&root);
  if (sharded == nullptr) {
    DDP_THROW(ConfigError, "config: 'train.sharding' is ", shardingName(config.train.sharding), " but model '", config.model.name,
              "' has no units to shard; use train.sharding: none or zero1");
  }
  if (group_.size() > 1) {
    c10::NoGradGuard noGrad;
    std::vector<at::Tensor> state;
    for (const auto& p : root.parameters()) state.push_back(p.detach());
    for (const auto& b : root.buffers()) state.push_back(b.detach());
    group_.broadcast(state);
  }
  // FSDP2's defaults: each unit reshards after its forward (the root keeps its parameters for its
  // backward), the next unit's all-gather prefetched in forward and backward. zero2: every unit
  // keeps them, gathered once per step.
  FullyShardOptions options;
  options.replicateParameters = config.train.sharding == Sharding::kZero2;
  std::vector<FullyShardedUnit> children;
  for (torch::nn::Module* unit : sharded->unitModules()) children.push_back(fullyShard(*unit, group_, options));
  sharded->setUnits(children);
  units_ = children;
  units_.push_back(fullyShard(root, group_, options));
  if (group_.rank() == 0) {
    int64_t shards = 0, whole = 0;
    for (const FullyShardedUnit& unit : units_) {
      shards += unit.shardedNumel();
      for (size_t i = 0; i < unit.parameters().size(); ++i) {
        int64_t numel = 1;
        for (const int64_t d : unit.fullShape(i)) numel *= d;
        whole += numel;
      }
    }
    spdlog::info("train.sharding {}: {} units ({} of the model's, then the root); rank 0 holds {} of the {} "
                 "parameters (padded shards{})", shardingName(config.train.sharding), units_.size(), children.size(),
                 shards, whole, options.replicateParameters ? ", and the whole parameters between steps" : "");
  }
}

data::LoaderOptions FullyShardedParallelism::loading(int64_t epoch, bool training) const {
  data::LoaderOptions o = loaderOptions(config_.data, device_, config_.seed, epoch);
  if (!training) o.augment = {};
  return o;
}

at::Tensor FullyShardedParallelism::rootForward(const at::Tensor& x) {
  return units_.back().forward([this](const at::Tensor& in) { return model_.forward(in); }, x);
}

at::Tensor FullyShardedParallelism::forward(const at::Tensor& x, bool lastMicroBatch) {
  units_.back().setRequiresGradientSync(lastMicroBatch);  // and the units inside it
  return rootForward(x);
}

EvalCounts FullyShardedParallelism::evaluate(const data::SampleSource& test) {
  const at::Tensor filler =
      at::zeros({1, input_.channels, input_.height, input_.width}, at::TensorOptions().device(device_));
  return evaluateCollective(evalForward(), module(), filler, test, device_, config_.eval.batchSize, group_,
                            loading(0, false));
}

// This rank's padded shards (FSDP2's all-gather input) and its sharded gradients, which are views
// of one reduce-scatter output of the same size per unit; zero2: the whole parameters kept (each
// unit's padded full buffer, whose rows the shards are: no paramDtype here).
void FullyShardedParallelism::describeMemory(TrainResult& result) {
  for (const FullyShardedUnit& unit : units_) {
    const std::vector<at::Tensor> params = unit.parameters();
    if (params.empty()) continue;
    const int64_t bytes = unit.shardedNumel() * static_cast<int64_t>(params.front().element_size());
    result.parameterBytes += unit.options().replicateParameters ? unit.gatheredBytes() : bytes;
    bool hasGrad = false;
    for (const auto& p : params) hasGrad = hasGrad || p.grad().defined();
    if (hasGrad) result.gradientBytes += bytes;
  }
}

at::Tensor FullyShardedParallelism::clipGradients(const std::vector<at::Tensor>& params, double maxNorm) {
  return clipGradNorm(params, maxNorm, group_);
}

bool FullyShardedParallelism::allFiniteOnEveryRank(const std::vector<at::Tensor>& tensors) {
  at::Tensor flag = at::full({1}, allFinite(tensors) ? 0.0 : 1.0, at::TensorOptions().device(group_.collectiveDevice()));
  group_.allReduce(flag, ReduceOp::kMax);
  return flag.item<double>() == 0.0;
}

void FullyShardedParallelism::agreeOnFlag(at::Tensor& flag) {
  if (group_.size() > 1) group_.allReduce(flag, ReduceOp::kMax);
}

std::function<at::Tensor(const at::Tensor&)> FullyShardedParallelism::evalForward() {
  return [this](const at::Tensor& x) { return rootForward(x); };
}

StateDict FullyShardedParallelism::exportState(bool writer) {
  StateDict state = withExportKeys(module(), fullStateDict(module()));  // every rank gathers
  return writer ? state : StateDict();
}

StateDict FullyShardedParallelism::rankState() { return fullStateDict(module()); }

}  // namespace ddp::worker
