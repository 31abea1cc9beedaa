// train.cuda_graph: the step (accumulate_steps 1) copied into static inputs and run on the graph's
// stream: eagerly for the first kGraphWarmupSteps, then captured once and replayed; the learning
// rate and the step number live on the device, the optimizer (fused SGD or Adam/AdamW) skips a
// non-finite step in its kernel. A batch of another shape (the last, partial one) runs uncaptured.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <vector>

#include "ddp/cuda_graph.h"
#include "worker/train/train_step.h"

namespace ddp::worker {

// Eager steps on the graph's stream before the capture (lazy initialisations, the reducer's first
// backward, which turns the gradients into bucket views, the optimizer's state).
constexpr int64_t kGraphWarmupSteps = 3;

class GraphStep : public TrainStep {
 public:
  /// `graph`: the parallelism's (made before its DDP engine); `sgd`: the optimizer when it is a
  /// plain SGD (stepped by ddp::fusedSgdStep), else null and s.fused is set.
  GraphStep(StepState& state, CudaGraph& graph, torch::optim::SGD* sgd, int world)
      : s_(state), graph_(graph), sgd_(sgd), world_(world) {}
  int64_t run(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader,
              const StepPlace& place) override;
  /// Replayed collectives are not ProcessGroupNCCL's works (its watchdog does not see them): waits
  /// for the last replay within comm.timeout_s (TimeoutError after it).
  void await() override;
  void report() const override;

 private:
  void body(const at::Tensor& images, const at::Tensor& labels);

  StepState& s_;
  CudaGraph& graph_;
  torch::optim::SGD* sgd_;
  const int world_;
  int64_t warmups_ = 0;
  int64_t uncaptured_ = 0;  // after the capture: steps whose batch did not fit the graph
  int64_t replays_ = 0;
  at::Tensor staticImages_, staticLabels_, lrTensor_, stepTensor_;
};

}  // namespace ddp::worker
