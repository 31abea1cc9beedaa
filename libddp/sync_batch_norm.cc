// ddp::SyncBatchNorm: torch/nn/modules/_functions.py's SyncBatchNorm in device-generic tensor ops
// (PyTorch's batch_norm_stats/_gather_stats_with_counts/_backward_reduce kernels are CUDA-only).
#include "ddp/sync_batch_norm.h"

#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/modules/batchnorm.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "libddp/internal.h"

namespace ddp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> reduceDims(const torch::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// (C) -> (1, C, 1, ...): broadcasts over an input of x's rank.
torch::Tensor perChannel(const torch::Tensor& t, const torch::Tensor& x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = t.size(0);
  return t.view(shape);
}

// What a group's all-gather gives, through one all-reduce: each rank fills its own row of a zero
// matrix and the sum is every rank's row, exactly (one collective of any dtype on every backend).
torch::Tensor allGatherRows(ProcessGroup& group, const torch::Tensor& mine) {
  torch::Tensor rows = torch::zeros({group.size(), mine.numel()}, mine.options());
  rows[group.rank()].copy_(mine);
  group.allReduce(rows);
  return rows;
}

// The group as the autograd context keeps it until backward (a handle: the group lives as long).
struct GroupHolder final : torch::CustomClassHolder {
  explicit GroupHolder(ProcessGroup g) : group(std::move(g)) {}
  ProcessGroup group;
};

struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  // Returns the normalised input; saves what backward needs, the group with it.
  // weight/bias (affine=false) and the running statistics (track_running_stats=false) may be
  // absent: optionals, since a Function's tensor arguments must be defined (each is a Variable input).
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor input, c10::optional<torch::Tensor> weightArg,
                               c10::optional<torch::Tensor> biasArg, c10::optional<torch::Tensor> runningMeanArg,
                               c10::optional<torch::Tensor> runningVarArg, double momentum, double eps,
                               const ProcessGroup& group) {
    const torch::Tensor weight = weightArg.value_or(torch::Tensor()), bias = biasArg.value_or(torch::Tensor());
    const torch::Tensor runningMean = runningMeanArg.value_or(torch::Tensor());
    const torch::Tensor runningVar = runningVarArg.value_or(torch::Tensor());
    const torch::Tensor x = input.contiguous();
    const int64_t channels = x.size(1);
    const int64_t count = x.size(1) > 0 ? x.numel() / channels : 0;
    // Statistics in float at least (PyTorch's accumulate type for half/bfloat16 inputs).
    const auto statType = x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    torch::Tensor mean, m2;
    if (count > 0) {
      const torch::Tensor xs = x.to(statType);
      mean = xs.mean(reduceDims(x));
      m2 = (xs - perChannel(mean, x)).pow(2).sum(reduceDims(x));  // sum of squared deviations
    } else {  // an empty local batch still takes part in the gather, with count 0
      mean = torch::zeros({channels}, x.options().dtype(statType));
      m2 = torch::zeros({channels}, x.options().dtype(statType));
    }
    const torch::Tensor mine =
        torch::cat({mean, m2, torch::full({1}, static_cast<double>(count), mean.options())});
    auto holder = c10::make_intrusive<GroupHolder>(group);
    const torch::Tensor rows = allGatherRows(holder->group, mine);  // (world, 2C + 1)
    const torch::Tensor means = rows.narrow(1, 0, channels);
    const torch::Tensor m2s = rows.narrow(1, channels, channels);
    const torch::Tensor counts = rows.narrow(1, 2 * channels, 1);  // (world, 1)
    // Chan et al.'s merge, count-weighted: ranks with no samples add nothing.
    const torch::Tensor total = counts.sum();
    const double n = total.item<double>();
    if (n <= 1) {
      DDP_THROW(ConfigError, "ddp::SyncBatchNorm: expected more than 1 value per channel when training, got ",
                static_cast<int64_t>(n), " over all ranks (input ", x.sizes(), ")");
    }
    const torch::Tensor globalMean = (means * counts).sum(0) / total;
    const torch::Tensor globalM2 = (m2s + counts * (means - globalMean.unsqueeze(0)).pow(2)).sum(0);
    const torch::Tensor var = globalM2 / total;  // biased: what normalises
    const torch::Tensor invstd = (var + eps).rsqrt();
    if (runningMean.defined()) {
      torch::NoGradGuard noGrad;
      runningMean.mul_(1 - momentum).add_(globalMean.to(runningMean.scalar_type()), momentum);
      runningVar.mul_(1 - momentum).add_((globalM2 / (n - 1)).to(runningVar.scalar_type()), momentum);
    }
    ctx->save_for_backward({x, weight, globalMean, invstd});
    ctx->saved_data["total"] = n;
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(holder));
    torch::Tensor out = (x.to(statType) - perChannel(globalMean, x)) * perChannel(invstd, x);
    if (weight.defined()) out = out * perChannel(weight.to(statType), x) + perChannel(bias.to(statType), x);
    return out.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list gradOutputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& mean = saved[2];
    const torch::Tensor& invstd = saved[3];
    const double n = ctx->saved_data["total"].toDouble();
    const auto holder = c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule());
    const auto statType = mean.scalar_type();
    const torch::Tensor dy = gradOutputs[0].contiguous().to(statType);
    const torch::Tensor xmu = x.to(statType) - perChannel(mean, x);
    const auto dims = reduceDims(x);
    const torch::Tensor sumDy = x.numel() > 0 ? dy.sum(dims) : torch::zeros_like(mean);
    const torch::Tensor sumDyXmu = x.numel() > 0 ? (dy * xmu).sum(dims) : torch::zeros_like(mean);
    // This rank's weight/bias gradients (DDP all-reduces them with the other parameters).
    torch::Tensor gradWeight, gradBias;
    if (weight.defined() && weight.requires_grad()) {
      gradWeight = (sumDyXmu * invstd).to(weight.scalar_type());
      gradBias = sumDy.to(weight.scalar_type());
    }
    // The input gradient needs the sums over the whole batch: one all-reduce of both (2C).
    torch::Tensor sums = torch::cat({sumDy, sumDyXmu});
    holder->group.allReduce(sums);
    const int64_t channels = mean.size(0);
    const torch::Tensor meanDy = sums.narrow(0, 0, channels) / n;
    const torch::Tensor meanDyXmu = sums.narrow(0, channels, channels) / n;
    torch::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight.to(statType);
    const torch::Tensor gradInput =
        ((dy - perChannel(meanDy, x) - xmu * perChannel(invstd * invstd * meanDyXmu, x)) * perChannel(scale, x))
            .to(x.scalar_type());
    return {gradInput, gradWeight, gradBias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor syncBatchNorm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                            const torch::Tensor& runningMean, const torch::Tensor& runningVar, double momentum,
                            double eps, ProcessGroup& group) {
  if (input.dim() < 2) {
    DDP_THROW(ConfigError, "ddp::SyncBatchNorm: expected an input of at least 2 dimensions (N, C, ...), got ",
              input.sizes());
  }
  internal::checkLive(group, "a forward through ddp::SyncBatchNorm");
  auto given = [](const torch::Tensor& t) { return t.defined() ? c10::optional<torch::Tensor>(t) : c10::nullopt; };
  return SyncBatchNormFunction::apply(input, given(weight), given(bias), given(runningMean), given(runningVar), momentum,
                                      eps, group);
}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_, ProcessGroup group)
    : options(options_), group_(std::move(group)) {
  SyncBatchNormImpl::reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_, ProcessGroup group,
                                     const torch::nn::Module& shareTensorsOf)
    : options(options_), group_(std::move(group)), shareFrom_(&shareTensorsOf) {
  SyncBatchNormImpl::reset();
  shareFrom_ = nullptr;  // a clone() must make tensors of its own
}

void SyncBatchNormImpl::reset() {
  // As torch::nn::BatchNorm registers them, so state dicts are interchangeable.
  const int64_t c = options.num_features();
  if (shareFrom_ != nullptr) {
    const auto params = shareFrom_->named_parameters(/*recurse=*/false);
    const auto buffers = shareFrom_->named_buffers(/*recurse=*/false);
    auto find = [this](const auto& dict, const char* key) -> torch::Tensor {
      const torch::Tensor* t = dict.find(key);
      if (t == nullptr || !t->defined()) {
        DDP_THROW(ConfigError, "ddp::SyncBatchNorm: ", shareFrom_->name(), " has no '", key,
                  "' to share; pass a BatchNorm layer with the same options");
      }
      return *t;
    };
    const torch::Tensor w = options.affine() ? find(params, "weight") : torch::Tensor();
    const torch::Tensor b = options.affine() ? find(params, "bias") : torch::Tensor();
    if (w.defined() && w.size(0) != c) {
      DDP_THROW(ConfigError, "ddp::SyncBatchNorm(", c, "): ", shareFrom_->name(), " has ", w.size(0), " features");
    }
    const bool track = options.track_running_stats();
    weight = register_parameter("weight", w, w.defined() && w.requires_grad());
    bias = register_parameter("bias", b, b.defined() && b.requires_grad());
    running_mean = register_buffer("running_mean", track ? find(buffers, "running_mean") : torch::Tensor());
    running_var = register_buffer("running_var", track ? find(buffers, "running_var") : torch::Tensor());
    num_batches_tracked =
        register_buffer("num_batches_tracked", track ? find(buffers, "num_batches_tracked") : torch::Tensor());
    return;
  }
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({c}));
    bias = register_parameter("bias", torch::zeros({c}));
  } else {
    weight = register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  torch::NoGradGuard noGrad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  torch::NoGradGuard noGrad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "ddp::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats() << ")";
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features()) {
    DDP_THROW(ConfigError, "ddp::SyncBatchNorm(", options.num_features(), "): expected an input (N, ",
              options.num_features(), ", ...), got ", input.sizes());
  }
  // BatchNorm's momentum rule: None is a cumulative average over the batches seen.
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    torch::NoGradGuard noGrad;
    num_batches_tracked.add_(1);
    if (!options.momentum().has_value()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  const bool useBatchStats = is_training() || !options.track_running_stats();
  // Python's rule: synchronise only in training with more than one rank.
  if (!useBatchStats || !is_training() || group_.size() == 1) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, useBatchStats, factor, options.eps(),
                             /*cudnn_enabled=*/true);
  }
  return syncBatchNorm(input, weight, bias, running_mean, running_var, factor, options.eps(), group_);
}

namespace {

template <typename BatchNorm>
bool replaceIfBatchNorm(torch::nn::Module& parent, const std::string& name, const std::string& path,
                        std::shared_ptr<torch::nn::Module>& child, const ProcessGroup& group, bool checkOnly) {
  auto bn = std::dynamic_pointer_cast<BatchNorm>(child);
  if (!bn) return false;
  // Held by the parent's registry and by `child`: a third owner is a member, a Sequential or a
  // ModuleList that would keep calling the old layer.
  if (bn.use_count() > 3) {
    DDP_THROW(ConfigError, "ddp::convertSyncBatchNorm: '", path, "' (", child->name(),
              ") is also held outside its parent's registry (a TORCH_MODULE member, a Sequential or a ModuleList), "
              "which would keep calling the old layer; declare that layer as ddp::SyncBatchNorm(",
              bn->options.num_features(), ", group) in the model instead");
  }
  if (checkOnly) return true;
  auto sync = std::make_shared<SyncBatchNormImpl>(bn->options, group, *bn);
  if (!bn->is_training()) sync->eval();
  child.reset();
  bn.reset();
  parent.replace_module(name, sync);
  return true;
}

int convertIn(torch::nn::Module& module, const std::string& prefix, const ProcessGroup& group, bool checkOnly) {
  int replaced = 0;
  std::vector<std::string> names;
  for (const auto& item : module.named_children()) names.push_back(item.key());
  for (const std::string& name : names) {
    std::shared_ptr<torch::nn::Module> child = module.named_children()[name];
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    if (replaceIfBatchNorm<torch::nn::BatchNorm1dImpl>(module, name, path, child, group, checkOnly) ||
        replaceIfBatchNorm<torch::nn::BatchNorm2dImpl>(module, name, path, child, group, checkOnly) ||
        replaceIfBatchNorm<torch::nn::BatchNorm3dImpl>(module, name, path, child, group, checkOnly)) {
      ++replaced;
    } else {
      replaced += convertIn(*child, path, group, checkOnly);
    }
  }
  return replaced;
}

}  // namespace

int convertSyncBatchNorm(torch::nn::Module& module, const ProcessGroup& group) {
  convertIn(module, "", group, /*checkOnly=*/true);  // a refusal leaves the model as it was
  return convertIn(module, "", group, /*checkOnly=*/false);
}

}  // namespace ddp
