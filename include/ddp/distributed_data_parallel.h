// ddp::DistributedDataParallel and its engine ddp::DdpEngine: gradients averaged over ranks
// during backward (torch.nn.parallel.DistributedDataParallel's twin).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "ddp/comm_hook.h"
#include "ddp/ddp_options.h"
#include "ddp/process_group.h"

namespace ddp {


/// The engine behind DistributedDataParallel, for any torch::nn::Module. Construction broadcasts
/// rank 0's parameters and buffers (collective). Per forward: beforeForward(), the module's forward,
/// afterForward(outputs); the next backward from those outputs leaves every .grad averaged over
/// ranks (bucketed all-reduces overlapped with backward, PyTorch DDP's Reducer).
class DdpEngine {
 public:
  DdpEngine(torch::nn::Module& module, ProcessGroup group, DdpOptions options = {});
  ~DdpEngine();
  DdpEngine(const DdpEngine&) = delete;
  DdpEngine& operator=(const DdpEngine&) = delete;

  void beforeForward();
  void afterForward(const std::vector<at::Tensor>& outputs);

  /// While a NoSync lives, backwards only accumulate locally (DDP's no_sync()): the first backward
  /// after it ends communicates the sum of all of them.
  class NoSync {
   public:
    explicit NoSync(DdpEngine& engine);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DdpEngine& engine_;
    bool previous_;
  };
  bool syncEnabled() const { return sync_; }
  /// In place of a forward and backward on a batch this rank does not have, while the other ranks
  /// run one (uneven shards that every rank knows of, e.g. ddp::DistributedSampler with pad =
  /// false): the collectives of that forward and backward, with this rank's .grad as it is — zeros
  /// after zero_grad, or what its micro-batches under noSync accumulated. Afterwards every .grad
  /// holds the mean over ranks, as after a backward, so every rank's optimizer steps alike and the
  /// replicas never part (ddp::Join instead leaves a joined rank's optimizer state behind). Buffers
  /// come from rank 0, as in any forward: rank 0 must hold a batch whenever some rank does (true of
  /// the sampler's shards; rank 0 calling this with buffers to broadcast warns once). Under noSync: only the forward's buffer broadcast (a zero gradient
  /// accumulates nothing). Not for a model whose forward communicates (SyncBatchNorm), nor inside a
  /// ddp::Join (there a rank out of batches just leaves the loop).
  void backwardWithoutBatch();
  /// optimizer.zero_grad(set_to_none=false) for the module's parameters, in fewer kernels: with
  /// gradientAsBucketView each bucket is zeroed at once (one kernel for every gradient it holds),
  /// other gradients one by one; undefined ones stay undefined. Before the forward, not during a
  /// backward (CommError).
  void zeroGrad();
  /// register_comm_hook: before the first forward, once; the bucketed reducer only.
  void registerCommHook(std::shared_ptr<CommHook> hook);
  ProcessGroup& group();

 private:
  friend class Join;
  struct State;
  std::unique_ptr<State> state_;
  bool sync_ = true;
};

namespace detail {
inline void collectTensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collectTensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename... T>
void collectTensors(const std::tuple<T...>& ts, std::vector<at::Tensor>& out) {
  std::apply([&out](const auto&... t) { (collectTensors(t, out), ...); }, ts);
}
template <typename A, typename B>
void collectTensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collectTensors(p.first, out);
  collectTensors(p.second, out);
}
}  // namespace detail

namespace detail {
template <typename T>
struct IsSharedModule : std::false_type {};
template <typename T>
struct IsSharedModule<std::shared_ptr<T>> : std::is_base_of<torch::nn::Module, T> {};

template <typename Model>
constexpr bool kIsModel = std::is_base_of_v<torch::detail::ModuleHolderIndicator, Model> || IsSharedModule<Model>::value;

// The module a holder or a shared_ptr points to; an empty one is a ConfigError, not a crash.
template <typename Model>
torch::nn::Module& moduleOf(Model& model) {
  if constexpr (IsSharedModule<Model>::value) {
    if (!model) throw ConfigError("ddp::DistributedDataParallel: the model is a null std::shared_ptr; pass the model");
    return *model;
  } else {
    if (model.is_empty()) {
      throw ConfigError("ddp::DistributedDataParallel: the model holder is empty (constructed from nullptr); pass a "
                        "constructed model");
    }
    return *model.ptr();
  }
}
}  // namespace detail

/// Wraps a model as you hold it: a module holder (a TORCH_MODULE type, e.g. `Net`, or any
/// torch::nn ModuleHolder such as torch::nn::Linear) or a std::shared_ptr to your torch::nn::Module
/// subclass (`std::make_shared<Model>()`). forward() returns what the module's forward returns: a
/// tensor, a vector, tuple or pair of tensors. module() is your model: save it, evaluate it, its
/// keys have no "module." prefix.
template <typename Model>
class DistributedDataParallel {
  static_assert(detail::kIsModel<Model>,
                "ddp::DistributedDataParallel<Model>: Model must be a module holder (a TORCH_MODULE type such as "
                "Net, or torch::nn::Linear) or a std::shared_ptr<YourModule> with YourModule derived from "
                "torch::nn::Module; hold a module you have by value with std::make_shared<YourModule>(...)");

 public:
  DistributedDataParallel(Model module, ProcessGroup group, DdpOptions options = {})
      : module_(std::move(module)), engine_(detail::moduleOf(module_), std::move(group), options) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    engine_.beforeForward();
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::collectTensors(output, tensors);
    engine_.afterForward(tensors);
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  Model& module() { return module_; }
  const Model& module() const { return module_; }
  DdpEngine& engine() { return engine_; }
  /// `{ auto guard = model.noSync(); ...forward, backward... }`: accumulate without communicating.
  [[nodiscard]] DdpEngine::NoSync noSync() { return DdpEngine::NoSync(engine_); }
  /// This rank has no batch for the step the others take (see DdpEngine::backwardWithoutBatch):
  /// `if (b < myBatches) model(x).backward... else model.backwardWithoutBatch(); opt.step();`
  void backwardWithoutBatch() { engine_.backwardWithoutBatch(); }
  /// `model.registerCommHook(ddp::powerSgdHook({.matrixApproximationRank = 2}))`, as
  /// register_comm_hook(state, powerSGD_hook): before the first forward, once.
  void registerCommHook(std::shared_ptr<CommHook> hook) { engine_.registerCommHook(std::move(hook)); }
  /// DdpEngine::zeroGrad: the gradients zeroed, one kernel per bucket with gradientAsBucketView.
  void zeroGrad() { engine_.zeroGrad(); }

  // The module's own calls (torch::nn::Module's names), so that code written for the model runs on
  // the wrapper unchanged: a function that took `Net&` takes the wrapper and keeps its body
  // (`model.train()`, `model.forward(x)`, `model.parameters()`, or `model->...` as on a holder).
  DistributedDataParallel* operator->() { return this; }
  const DistributedDataParallel* operator->() const { return this; }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  bool is_training() const { return module_->is_training(); }
  std::vector<at::Tensor> parameters(bool recurse = true) const { return module_->parameters(recurse); }
  torch::OrderedDict<std::string, at::Tensor> named_parameters(bool recurse = true) const {
    return module_->named_parameters(recurse);
  }
  std::vector<at::Tensor> buffers(bool recurse = true) const { return module_->buffers(recurse); }
  torch::OrderedDict<std::string, at::Tensor> named_buffers(bool recurse = true) const {
    return module_->named_buffers(recurse);
  }
  /// The module's zero_grad, with LibTorch 2.x's default on every LibTorch (set_to_none = true; 1.13
  /// defaulted to false). zeroGrad() keeps the gradients' tensors (and their bucket views).
  void zero_grad(bool setToNone = true) { module_->zero_grad(setToNone); }

 private:
  Model module_;
  DdpEngine engine_;
};

}  // namespace ddp
