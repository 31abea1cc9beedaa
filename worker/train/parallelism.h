// What differs between the modes: how one step is computed (ddp/single: the library's DdpEngine;
// dp: DataParallel's replicas) and evaluated, behind one interface the training loop calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

#include "ddp/cuda_graph.h"
#include "ddp/process_group.h"
#include "ddp/state_dict.h"
#include "worker/data/batch_loader.h"
#include "worker/data/sample_source.h"
#include "worker/data/tensor_dataset.h"
#include "worker/train/evaluate.h"
#include "worker/train/trainer.h"

namespace ddp::worker {

/// How a mode computes one step. ddp/single: one replica per process, gradients averaged over the
/// group by the library's DdpEngine (bucketed or flat). dp: one process, the replicas on threads or GPUs,
/// the batch scattered and one loss on the gathered outputs (DataParallel).
class Parallelism {
 public:
  virtual ~Parallelism() = default;
  /// The plain model (no wrapper): the optimizer, checkpoints and the export use it.
  virtual torch::nn::Module& module() = 0;
  /// The group the loop's own collectives use (a group of one for dp).
  virtual ProcessGroup& group() = 0;
  /// Labels go here; the loss is computed here.
  virtual c10::Device lossDevice() const = 0;
  /// How batches are made for `epoch`; training: augmentation on, else off.
  virtual data::LoaderOptions loading(int64_t epoch, bool training) const = 0;
  /// The model's output on `x`; `lastMicroBatch` false: this backward must only accumulate.
  virtual at::Tensor forward(const at::Tensor& x, bool lastMicroBatch) = 0;
  /// train.uneven_inputs join: in place of forward and backward for a micro-batch this rank does
  /// not have while others do; lastMicroBatch true: the step's gradient sync, with this rank's
  /// accumulated (or zero) gradients.
  virtual void backwardWithoutBatch(bool lastMicroBatch);
  /// Zeroes the gradients of `params` (the module's), keeping the tensors (they may alias
  /// communication buckets): ddp, one kernel per bucket.
  virtual void zeroGrad(const std::vector<at::Tensor>& params);
  /// Whether the logged loss still needs averaging over ranks (the gradient sync carries gradients only).
  virtual bool lossNeedsAverage() const { return false; }
  /// Correct predictions over the whole test set (a collective in ddp).
  virtual EvalCounts evaluate(const data::SampleSource& test) = 0;
  /// Appended to progress lines ("(4 replicas)").
  virtual std::string progressNote() const { return {}; }
  /// train.cuda_graph: the graph the step is captured into, made before the DDP engine so that the
  /// engine's gradient hooks belong to the graph's stream (PyTorch: construct DDP in a side-stream
  /// context); null where this mode has none.
  virtual CudaGraph* cudaGraph() { return nullptr; }
  /// The GPUs whose generators checkpoints keep for this process (mode dp: every replica's, in
  /// order); empty: the group's device.
  virtual std::vector<c10::Device> cudaGenerators() const { return {}; }
  /// Adds what the parallelism knows to the run's result (a communication hook's statistics).
  virtual void describe(TrainResult&) const {}
  /// This rank's bytes of parameters and gradients (result.parameterBytes, gradientBytes): the
  /// module's tensors; train.sharding full: its shards.
  virtual void describeMemory(TrainResult& result);
  /// train.clip_grad_norm: clips the gradients of `params` to `maxNorm` by their norm, which it
  /// returns (before clipping). Replicated gradients: this rank's norm is every rank's.
  virtual at::Tensor clipGradients(const std::vector<at::Tensor>& params, double maxNorm);
  /// Whether every tensor of `tensors` is finite on every rank. Replicated gradients and weights
  /// are equal everywhere, so this rank's look is enough; sharded ones are agreed on (collective).
  virtual bool allFiniteOnEveryRank(const std::vector<at::Tensor>& tensors);
  /// A step's non-finite flag on the device, made the same on every rank where the ranks hold
  /// different gradients (shards), so that every rank skips or applies the step alike.
  virtual void agreeOnFlag(at::Tensor& /*flag*/) {}
  /// The forward of evaluation and the validation loss (no gradient sync); null: the module's own.
  virtual std::function<at::Tensor(const at::Tensor&)> evalForward() { return nullptr; }
  /// The export's state dict (the keys Python loads), needed on rank 0 only (`writer`); others may
  /// get an empty one. Collective where the parameters are sharded.
  virtual StateDict exportState(bool writer);
  /// output.dump_rank_params: this rank's parameters and buffers (full sharding: gathered, collective).
  virtual StateDict rankState();
};

}  // namespace ddp::worker
