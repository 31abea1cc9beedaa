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
  /// run's micro-batches before `start` (optimizer steps done × train.accumulate_steps), the key of
  /// random token windows' draws: one key per micro-batch of the run, whatever the world size.
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

/// Windows of `data` in ddp::TokenSampler's order (`options`: B, T, rank, world, seed, sampling):
/// a position is a row (window) of the epoch, a batch the B window starts of one step's slot; in
/// random sampling a slot's draws come from (seed, rank, epoch × slots per epoch + slot), so a resume
/// draws what the interrupted run would have.
std::unique_ptr<TrainOrder> tokenOrder(std::shared_ptr<const TokenData> data, const TokenSamplerOptions& options);

}  // namespace ddp::worker
