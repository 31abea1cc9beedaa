// train.sharding full and zero2 in mode ddp / single: no DDP engine; the model's units
// (models/sharded_units.h: the GPT's blocks, the MLP's and CNN's layers, the ResNet's stages), then
// the model itself as the root, sharded with ddp::fullyShard (FSDP2; zero2: its replicateParameters,
// DeepSpeed's ZeRO stage 2), and trained by the one loop of training_loop.h.
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>

#include <optional>
#include <vector>

#include "ddp/fully_shard.h"
#include "worker/config/config.h"
#include "worker/models/models.h"
#include "worker/train/parallelism.h"

namespace ddp::worker {

/// Every forward (training, evaluation, the validation loss) runs through the root unit: a
/// collective that every rank joins alike. The optimizer, built on module().parameters() after
/// this constructor, steps the shards; mixed precision is the loop's autocast on the gathered fp32
/// parameters (no paramDtype), so the shards, gradients and optimizer state stay fp32. zero2: the
/// units keep their gathered parameters between steps (replicateParameters), the rest the same.
class FullyShardedParallelism final : public Parallelism {
 public:
  /// Starts every rank from rank 0's values (DDP's constructor does the same; init.model_path is
  /// read by rank 0 only), then shards the units and the root. `input`: the shape of one sample
  /// (the filler of evaluation's extra forwards).
  FullyShardedParallelism(const WorkerConfig& config, const ProcessGroup& group, torch::nn::AnyModule& model,
                          const InputSpec& input);

  torch::nn::Module& module() override { return *model_.ptr(); }
  ProcessGroup& group() override { return group_; }
  c10::Device lossDevice() const override { return device_; }
  data::LoaderOptions loading(int64_t epoch, bool training) const override;
  /// Only the last micro-batch's backward reduce-scatters (set_requires_gradient_sync).
  at::Tensor forward(const at::Tensor& x, bool lastMicroBatch) override;
  bool lossNeedsAverage() const override { return group_.size() > 1; }
  EvalCounts evaluate(const data::SampleSource& test) override;
  void describeMemory(TrainResult& result) override;
  at::Tensor clipGradients(const std::vector<at::Tensor>& params, double maxNorm) override;
  bool allFiniteOnEveryRank(const std::vector<at::Tensor>& tensors) override;
  void agreeOnFlag(at::Tensor& flag) override;
  std::function<at::Tensor(const at::Tensor&)> evalForward() override;
  StateDict exportState(bool writer) override;
  StateDict rankState() override;

 private:
  at::Tensor rootForward(const at::Tensor& x);

  const WorkerConfig& config_;
  ProcessGroup group_;
  c10::Device device_;
  torch::nn::AnyModule& model_;
  InputSpec input_;
  std::vector<FullyShardedUnit> units_;  // the model's units, then the root (last)
};

}  // namespace ddp::worker
