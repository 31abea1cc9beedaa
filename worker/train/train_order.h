// The order the training loop walks a training set in: each epoch's batches for this rank, the
// positions they consume (what a checkpoint records, so that a resume at any world size continues
// with the next unseen sample), and the loader that makes them. Images and tensors go through
// ddp::DistributedSampler (samplerOrder); token windows through ddp::TokenSampler (tokenOrder).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/sampler.h"
#include "ddp/token_data.h"
#include "worker/data/batch_loader.h"
#include "worker/data/sample_source.h"

namespace ddp::worker {

class TrainOrder {
 public:
  virtual ~TrainOrder() = default;
  /// Positions in an epoch (samples, or token windows): the unit of TrainPosition::epochSamples.
  virtual int64_t epochSize() const = 0;
  /// Sets `epoch` from `start` positions consumed (all ranks); returns the micro-batch slots every
  /// rank steps through from there (rank 0's batches: it holds the most). `firstMicroStep`: the
  /// run's micro-batches before `start` (microStepsAfter), the key of random token windows' draws:
  /// one key per micro-batch of the run, whatever the world size and train.accumulate_steps.
  virtual int64_t setEpoch(int64_t epoch, int64_t start, int64_t firstMicroStep) = 0;
  /// This rank's batches of the epoch as set: what loader() makes, in order.
  virtual std::vector<std::vector<int64_t>> batches() const = 0;
  /// Positions consumed, all ranks, after `batches` slots from the set start.
  virtual int64_t positionAfter(int64_t batches) const = 0;
  /// train.uneven_inputs join: the samples every rank consumed in the slots [first, first + count).
  virtual int64_t samplesInBatches(int64_t first, int64_t count) const = 0;
  /// The loader of `plan` (batches()), made ahead per `options`.
  virtual std::unique_ptr<data::BatchLoader> loader(std::vector<std::vector<int64_t>> plan,
                                                    data::LoaderOptions options) const = 0;
};

/// `train`'s samples (in memory or streamed) in ddp::DistributedSampler's order (PyTorch's), batches
/// of `batchSize`.
std::unique_ptr<TrainOrder> samplerOrder(data::SampleSource train, int world, int rank,
                                         const SamplerOptions& options, int64_t batchSize);

/// The run's micro-batches once `steps` optimizer steps are done, `accumulate` a step since the
/// resumed checkpoint's `resumedStep` (0 for a run not resumed). Its `resumedMicroSteps`
/// (TrainPosition::microSteps) count the micro-batches of the run that wrote it, so a resume with
/// fewer a step draws none of theirs again; -1 (a checkpoint written before they were recorded)
/// counts `accumulate` for each of its steps as well.
inline int64_t microStepsAfter(int64_t resumedStep, int64_t resumedMicroSteps, int64_t steps, int64_t accumulate) {
  const int64_t atResume = resumedMicroSteps >= 0 ? resumedMicroSteps : resumedStep * accumulate;
  return atResume + (steps - resumedStep) * accumulate;
}

/// Windows of `data` in ddp::TokenSampler's order (`options`: B, T, rank, world, seed, sampling):
/// a position is a row (window) of the epoch, a batch the B window starts of one step's slot; in
/// random sampling a slot's draws come from (seed, rank, the run's micro-batch: setEpoch's
/// firstMicroStep + slot), so a resume draws what the interrupted run would have.
std::unique_ptr<TrainOrder> tokenOrder(std::shared_ptr<const TokenData> data, const TokenSamplerOptions& options);

}  // namespace ddp::worker
