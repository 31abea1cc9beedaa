// train.sharding full: the hook point through which a model's own forward runs its submodules as
// units of fully sharded data parallel (ddp::fullyShard). LibTorch modules have no forward hooks,
// so each model that can be sharded names its units and calls them through runUnit(); without
// units (every other run) runUnit() is a plain call, and the state dict's keys never change.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "ddp/activation_checkpoint.h"
#include "ddp/fully_shard.h"

namespace ddp::worker {

/// Mixed into a model (GPT: its blocks; MLP, CNN: each layer but the output layer; ResNet: each
/// residual stage). The root unit (the model itself, holding the rest) is the caller's.
class ShardedUnits {
 public:
  ShardedUnits() = default;
  // A clone (mode dp's replicas) is a new model: it never shares the original's units.
  ShardedUnits(const ShardedUnits&) {}
  ShardedUnits& operator=(const ShardedUnits&) { return *this; }
  virtual ~ShardedUnits() = default;

  /// The submodules to shard one unit each, in forward order (unit i is runUnit(i)'s).
  virtual std::vector<torch::nn::Module*> unitModules() = 0;
  /// The units made from unitModules(), in the same order; from now on the forward runs them.
  void setUnits(std::vector<FullyShardedUnit> units) { units_ = std::move(units); }
  const std::vector<FullyShardedUnit>& units() const { return units_; }

  /// train.activation_checkpointing: each unit's forward through ddp::activationCheckpoint, its
  /// activations recomputed in backward (inside the unit when the model is sharded).
  void setActivationCheckpointing(bool on) { checkpointed_ = on ? unitModules() : std::vector<torch::nn::Module*>{}; }

 protected:
  /// `fn(x)` as unit i's forward when the model is sharded, else `fn(x)`; checkpointed, the call is
  /// kept for the recompute in backward: `fn` must hold what it uses by value (no [&] of locals).
  template <typename Fn>
  at::Tensor runUnit(size_t i, Fn&& fn, const at::Tensor& x) {
    if (i < checkpointed_.size()) {
      auto body = [owner = checkpointed_[i], call = std::function<at::Tensor(const at::Tensor&)>(std::forward<Fn>(fn))](
                      const at::Tensor& in) { return activationCheckpoint(*owner, call, in); };
      if (i >= units_.size()) return body(x);
      return units_[i].forward(body, x);
    }
    if (i >= units_.size()) return fn(x);
    return units_[i].forward(std::forward<Fn>(fn), x);
  }

 private:
  std::vector<FullyShardedUnit> units_;
  std::vector<torch::nn::Module*> checkpointed_;  // unit i's module, when checkpointed
};

}  // namespace ddp::worker
