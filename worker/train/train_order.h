// The order the training loop walks a training set in: each epoch's batches for this rank, the
// positions they consume (what a checkpoint records, so that a resume at any world size continues
// with the next unseen sample), and the loader that makes them. Images and tensors go through
// ddp::DistributedSampler (samplerOrder); token windows through ddp::TokenSampler (tokenOrder,
// worker/data/token_set.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/sampler.h"
#include "worker/data/batch_loader.h"
#include "worker/data/tensor_dataset.h"

namespace ddp::worker {

class TrainOrder {
 public:
  virtual ~TrainOrder() = default;
  /// Positions in an epoch (samples, or token windows): the unit of TrainPosition::epochSamples.
  virtual int64_t epochSize() const = 0;
  /// Sets `epoch` from `start` positions consumed (all ranks); returns the micro-batch slots every
  /// rank steps through from there (rank 0's batches: it holds the most).
  virtual int64_t setEpoch(int64_t epoch, int64_t start) = 0;
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

/// `train`'s samples in ddp::DistributedSampler's order (PyTorch's), batches of `batchSize`.
std::unique_ptr<TrainOrder> samplerOrder(const data::TensorDataset& train, int world, int rank,
                                         const SamplerOptions& options, int64_t batchSize);

}  // namespace ddp::worker
