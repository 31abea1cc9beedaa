// How DDP's engine averages gradients over the ranks (GradientSync: the bucketed Reducer of
// libddp/engine/reducer.h, or one flat all-reduce after backward). DDP's own logic, written against
// the public ddp::ProcessGroup like any user's code (tests/libddp/layers_test.sh: no comm/ here).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "ddp/process_group.h"

namespace ddp::engine {

/// Averages gradients over the ranks during backward; DDP's engine drives one per model.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  /// Arms the next backward from `outputs` (the forward's outputs): when that backward returns,
  /// every parameter's .grad holds the mean over ranks. Backwards not armed (DDP's no_sync) only
  /// accumulate locally.
  virtual void prepareForBackward(const std::vector<at::Tensor>& outputs) = 0;
  /// In place of a synchronising backward on a rank that has no batch for it: the collectives
  /// that backward runs, with each .grad as it is (zeros where undefined); afterwards every .grad
  /// holds the mean over ranks, as after a backward.
  virtual void reduceWithoutBackward() = 0;
};

/// One all-reduce of all gradients once backward is done (allReduceGradients): one collective
/// per step, none of it overlapped with backward; a parameter without a gradient counts as zeros.
/// Backward must flow through one of the armed outputs.
class FlatGradientSync final : public GradientSync {
 public:
  FlatGradientSync(ProcessGroup group, std::vector<at::Tensor> params);
  void prepareForBackward(const std::vector<at::Tensor>& outputs) override;
  void reduceWithoutBackward() override;

 private:
  struct State {
    ProcessGroup group;
    std::vector<at::Tensor> params;
  };
  std::shared_ptr<State> state_;  // hooks on outputs that outlive the engine see it gone
};

/// Averages the gradients of `params` over all ranks, in place: pre-divides by the world size and
/// SUM-reduces, in one collective (the same bits on every backend). Parameters without a gradient
/// contribute zeros (and get them). `extra` (e.g. the loss) rides in the same buffer and is
/// averaged too; may be undefined.
void allReduceGradients(ProcessGroup& group, const std::vector<at::Tensor>& params, at::Tensor extra = {});

}  // namespace ddp::engine
