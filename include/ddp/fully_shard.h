// ddp::fullyShard: fully sharded data parallel with FSDP2's semantics
// (torch.distributed.fsdp.fully_shard): each unit's parameters, gradients and optimizer state are
// sharded on dim 0 over the group; a unit's parameters are gathered only around its forward and
// its backward. With FullyShardOptions::replicateParameters the same machinery is ZeRO-2: the
// parameters stay gathered, the gradients and optimizer state sharded.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/process_group.h"
#include "ddp/state_dict.h"

namespace ddp {

/// fully_shard's arguments.
struct FullyShardOptions {
  /// FSDP2's reshard_after_forward: free the unit's gathered parameters after its forward and
  /// gather them again for its backward (less memory, one more all-gather). nullopt (FSDP2's None):
  /// true, except for the root (the unit whose forward is outermost), which keeps them, as its
  /// backward starts right after its forward.
  std::optional<bool> reshardAfterForward;
  /// FSDP2's implicit backward prefetch: when this unit's backward starts, it starts the
  /// all-gather of the unit whose forward ended before its own, so that gather overlaps this
  /// unit's backward (on GPUs; CPU backends gain nothing). One more gathered unit in memory.
  bool backwardPrefetch = true;
  /// FSDP1's forward_prefetch (FSDP2: set_modules_to_forward_prefetch, given the order): when this
  /// unit's forward starts, it starts the all-gather of the unit whose forward came next in the
  /// previous forward with autograd, so that gather overlaps this unit's forward. Nothing in the
  /// first step (the order is not known yet), nor in forwards without autograd; the same values
  /// either way. One more gathered unit in memory.
  bool forwardPrefetch = true;
  /// ZeRO-2 (DeepSpeed's ZeRO stage 2; FSDP1's ShardingStrategy.SHARD_GRAD_OP and FSDP2's
  /// reshard_after_forward=False are the nearest, but free the gathered parameters after
  /// backward): the parameters are gathered once per step, in the unit's first forward, and stay
  /// in memory whole, the gradients and the optimizer state sharded. Outside forward and backward
  /// the parameters' data are still the shards (the optimizer steps them, with the sharded .grad),
  /// but the full buffer keeps its bytes and the next forward all-gathers into it; a backward
  /// without gradient sync leaves the parameters gathered (FSDP2's set_reshard_after_backward(False)),
  /// so accumulation communicates on the last micro-batch only. Per rank: the full parameters (the
  /// shards are views of this rank's rows of them; with a paramDtype a copy in its own dtype),
  /// 1/N of the gradients and optimizer state; per step one all-gather and one reduce-scatter per
  /// unit, DDP's traffic. Requires reshardAfterForward unset or false.
  bool replicateParameters = false;
  // FSDP2's MixedPrecisionPolicy. The shards, their gradients and the optimizer keep the
  // parameters' own dtype.
  /// param_dtype: the dtype of the all-gather and of the gathered parameters the forward and
  /// backward compute with (e.g. at::kBFloat16); nullopt: the parameters' own.
  std::optional<at::ScalarType> paramDtype;
  /// reduce_dtype: the dtype the full gradients are reduce-scattered (and, without gradient
  /// sync, accumulated) in; nullopt: the parameters' own (as the pinned PyTorch's FSDP2, whose
  /// unsharded gradients take the parameters' dtype).
  std::optional<at::ScalarType> reduceDtype;
  /// cast_forward_inputs: floating-point tensor inputs of the unit's forward are cast to
  /// paramDtype (when set).
  bool castForwardInputs = true;
};

namespace detail {
template <typename T>
inline constexpr bool kIsTensorArg = std::is_same_v<std::decay_t<T>, at::Tensor>;

// For each argument, the index of its tensor among the tensor arguments.
template <typename... Args>
constexpr std::array<size_t, sizeof...(Args)> tensorArgIndices() {
  std::array<size_t, sizeof...(Args)> out{};
  constexpr bool isTensor[] = {kIsTensorArg<Args>..., false};
  size_t k = 0;
  for (size_t i = 0; i < sizeof...(Args); ++i) {
    out[i] = k;
    if (isTensor[i]) ++k;
  }
  return out;
}

template <typename Arg>
decltype(auto) routedArg(Arg&& arg, const std::vector<at::Tensor>& routed, size_t k) {
  if constexpr (kIsTensorArg<Arg>) {
    return static_cast<const at::Tensor&>(routed[k]);
  } else {
    return std::forward<Arg>(arg);
  }
}

template <typename Fn, typename Tuple, size_t... I>
decltype(auto) callRouted(Fn& fn, Tuple&& args, const std::vector<at::Tensor>& routed, std::index_sequence<I...>) {
  constexpr auto indices = tensorArgIndices<std::tuple_element_t<I, std::decay_t<Tuple>>...>();
  (void)indices;
  return fn(routedArg(std::get<I>(std::forward<Tuple>(args)), routed, indices[I])...);
}
}  // namespace detail

/// One unit of fully sharded data parallel (FSDP2's FSDPModule state), made by ddp::fullyShard:
/// a handle (copies share the unit; keep one as long as the module trains). Each parameter of
/// the unit stays the tensor its module holds (module->parameters() are the same tensors), but
/// outside the unit's forward and backward its data is this rank's dim-0 shard (FSDP2's local
/// shard: rows [rank*c, rank*c + c) of the full tensor, c = ceil(dim0 / size()), fewer or none at
/// the end) and after backward its .grad is the sharded gradient averaged over the group: any
/// torch::optim optimizer, or ddp::FusedAdamW, built on model->parameters() steps the shards.
/// LibTorch modules have no forward hooks, so the unit's forward goes through forward() (or
/// ddp::FullyShard<Model>): before it the unit all-gathers its parameters; after it (with
/// reshardAfterForward) frees them; its outputs' gradients gather them again in backward; once its
/// backward is done its gradients are reduce-scattered into the sharded ones. Collective: every
/// rank runs the same units' forwards and backwards in the same order. Keep the module alive as
/// long as the unit; move it to its device before sharding (Module::to() would replace the
/// shards). Several forwards of the root before one backward (their losses summed) give DDP's
/// result, and a unit may run several times within one forward. Build or step the optimizer on
/// the sharded parameters only: one stepped before fullyShard holds state of the full shapes, and
/// a step between unshard() and reshard() meets full parameters with sharded gradients (both fail
/// with LibTorch's size error; FSDP2's optimizer steps its DTensor shards whatever unshard did).
/// As in FSDP2, parameters outside every unit (the root not sharded) and modules replaced after
/// sharding are not reduced: their ranks drift apart unnoticed.
class FullyShardedUnit {
 public:
  /// `unit.forward([&](const at::Tensor& x) { return block->forward(x); }, x)`: runs `fn` with
  /// the arguments as the unit's forward and returns what it returns (a tensor, a vector, tuple
  /// or pair of tensors). Tensor arguments reach `fn` through FSDP2's post-backward marker (use
  /// the ones `fn` receives); other arguments pass as they are.
  template <typename Fn, typename... Args>
  auto forward(Fn&& fn, Args&&... args) {
    std::vector<at::Tensor> inputs;
    (collectInput(inputs, args), ...);
    const std::vector<at::Tensor> routed = beforeForward(inputs);
    auto output = [&] {
      try {
        return detail::callRouted(fn, std::forward_as_tuple(std::forward<Args>(args)...), routed,
                                  std::index_sequence_for<Args...>{});
      } catch (...) {
        abandonForward();
        throw;
      }
    }();
    std::vector<at::Tensor> outputs;
    detail::collectTensors(output, outputs);
    afterForward(outputs);
    return output;
  }

  /// The two halves of forward() for a loop that calls the module itself: beforeForward gathers
  /// the parameters and returns `inputs` to use in their place; afterForward(outputs) reshards
  /// (per reshardAfterForward) and hooks the backward on the outputs.
  std::vector<at::Tensor> beforeForward(const std::vector<at::Tensor>& inputs);
  void afterForward(const std::vector<at::Tensor>& outputs);
  /// After a forward that threw: leaves the unit as afterForward would, without hooks.
  void abandonForward();

  /// FSDP2's unshard(): all-gathers the parameters (their data becomes the full tensors, in
  /// paramDtype when set, until reshard() or the next backward's end). Collective; nothing to do
  /// when already gathered. For the full values in their own dtype: fullStateDict(). Step the
  /// optimizer after reshard(), not in between (see the class comment).
  void unshard();
  /// FSDP2's reshard(): frees the gathered parameters, their data becomes the shards again
  /// (replicateParameters: the full buffer keeps its bytes, for the next gather).
  void reshard();
  /// Whether the parameters hold their shards now (false between unshard() and reshard()).
  bool isSharded() const;
  /// The bytes the unit's full buffer holds now: the gathered parameters (in paramDtype, padded),
  /// 0 once freed; under replicateParameters never freed (allocated by fullyShard, or with a
  /// paramDtype by the first forward).
  int64_t gatheredBytes() const;
  /// FSDP2's set_requires_gradient_sync: with false, backwards accumulate full (unsharded)
  /// gradients without communicating and leave the sharded .grad as it was; the first backward
  /// with true reduce-scatters their sum with its own (gradient accumulation over micro-batches,
  /// DDP's no_sync). `recurse`: the units of the module's submodules too. Not during a backward.
  /// Under replicateParameters the parameters stay gathered meanwhile, their .grad unset until
  /// the synced backward restores the sharded one.
  void setRequiresGradientSync(bool requiresSync, bool recurse = true);

  /// The unit's parameters as the module names them (those of child units left out), in order.
  const std::vector<std::string>& parameterNames() const;
  /// The same parameters (the module's own tensors).
  std::vector<at::Tensor> parameters() const;
  /// The full shape of parameter i (parameters()[i]).
  std::vector<int64_t> fullShape(size_t i) const;
  /// This rank's elements of the unit: its padded shards (FSDP2's all-gather input).
  int64_t shardedNumel() const;
  /// The module this unit shards.
  torch::nn::Module& module() const;
  const FullyShardOptions& options() const;
  ProcessGroup& group() const;

  struct Impl;
  explicit FullyShardedUnit(std::shared_ptr<Impl> impl);

 private:
  template <typename T>
  static void collectInput(std::vector<at::Tensor>& inputs, const T& value) {
    if constexpr (detail::kIsTensorArg<T>) inputs.push_back(value);
  }
  std::shared_ptr<Impl> impl_;
};

/// fully_shard(module, mesh=...): makes `module` a unit of fully sharded data parallel over
/// `group` with the parameters of `module` and its submodules that no unit holds yet; its
/// parameters' data becomes this rank's shards (padded as FSDP2 pads) at once, their .grad is
/// cleared. Apply it to the units you choose from the leaves up: each transformer block, then the
/// root. Every rank must hold the same initial values (build the model from the same seed, or load
/// them before). Throws ConfigError for a destroyed group, a module already sharded, a parameter
/// another unit holds (a parameter shared by two units, named), or parameters of several dtypes
/// or devices, or with no dimension, or replicateParameters with reshardAfterForward true.
[[nodiscard]]
FullyShardedUnit fullyShard(torch::nn::Module& module, ProcessGroup group, FullyShardOptions options = {});

/// clip_grad_norm_ over the sharded gradients of fully sharded parameters (FSDP2's DTensors):
/// the norm is the global one, the square root of the sum over ranks of each rank's sum of
/// squares (one all-reduce), and every rank scales its shards by maxNorm / (norm + 1e-6) when the
/// norm exceeds maxNorm. Collective. A parameter of no unit (a DDP model's, whole and equal on
/// every rank: DTensor's Replicate) counts once, so for a DDP model this is clip_grad_norm_'s
/// norm. Returns the norm (0-dim). ConfigError for maxNorm <= 0.
at::Tensor clipGradNorm(const std::vector<at::Tensor>& params, double maxNorm, ProcessGroup& group);

/// FSDP2's get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)): every
/// parameter of `model` by its name, full, gathered from the shards of its unit (in the
/// parameters' own dtype, whatever paramDtype says), the other parameters and the buffers as
/// they are; CPU tensors, on every rank. The keys and shapes of the unsharded model: the export
/// (`auto full = ddp::fullStateDict(*model); if (group.rank() == 0) ddp::saveStateDict(full, path);`,
/// or ddp::saveModel(*model, path, group)), which Python and a DDP run load. Collective (one
/// all-gather per unit): every rank calls it, not rank 0 alone.
StateDict fullStateDict(const torch::nn::Module& model);

/// set_model_state_dict with a full state dict (fullStateDict's, or a DDP or single-process run's
/// state dict, its keys' "module." / "_orig_mod." prefixes dropped): each rank copies its rows of
/// every sharded parameter, and the other parameters and buffers whole. Not a collective. Strict:
/// ConfigError naming a missing, mis-shaped or unexpected key, before anything is changed.
void loadFullStateDict(torch::nn::Module& model, const StateDict& state);

/// A module and its unit in one, as DistributedDataParallel<Model>: `ddp::FullyShard<Block>
/// block(Block(...), group)` then `block(x)` runs `block->forward(x)` as the unit's forward.
template <typename Model>
class FullyShard {
 public:
  FullyShard(Model model, ProcessGroup group, FullyShardOptions options = {})
      : model_(std::move(model)), unit_(fullyShard(*model_, std::move(group), options)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    return unit_.forward([this](auto&&... a) { return model_->forward(std::forward<decltype(a)>(a)...); },
                         std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  Model& module() { return model_; }
  FullyShardedUnit& unit() { return unit_; }

 private:
  Model model_;
  FullyShardedUnit unit_;
};

}  // namespace ddp
