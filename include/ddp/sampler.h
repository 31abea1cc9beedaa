// ddp::DistributedSampler: each rank's share of the data set, bit-identical to PyTorch's
// torch.utils.data.DistributedSampler.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

struct SamplerOptions {
  bool shuffle = true;    // reshuffled every epoch from seed + epoch
  uint64_t seed = 0;      // equal on every rank
  bool dropLast = false;  // false: pad by repeating the head, so every rank has as many samples
  /// With dropLast false. true: PyTorch's padding. false: no sample twice and none dropped; rank r
  /// gets ceil((N - r) / W) samples (the shards differ by at most one, the lower ranks holding
  /// more): uneven inputs, for ddp::Join or DistributedDataParallel::backwardWithoutBatch().
  bool pad = true;
};

/// For torch::data::make_data_loader use ddp::DataLoaderSampler (<ddp/data_loader.h>).
class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, const ProcessGroup& group, SamplerOptions options = {});
  DistributedSampler(int64_t datasetSize, int numReplicas, int rank, SamplerOptions options = {});
  ~DistributedSampler();
  DistributedSampler(DistributedSampler&&) noexcept;
  DistributedSampler& operator=(DistributedSampler&&) noexcept;

  /// Call before every epoch, or every epoch sees the same order (Python's set_epoch; here a second
  /// batches() without setEpoch in between warns once, when shuffling).
  void setEpoch(int64_t epoch);
  /// An epoch resumed part-way, at this or another world size: `start` positions of the epoch's
  /// permutation were consumed already (TrainPosition::epochSamples of the checkpoint), and the
  /// rest is dealt out over this group's ranks round-robin, so no sample of the epoch is seen twice
  /// or skipped (besides the padding at the epoch's end, from the permutation's head). At the same
  /// world size the shards continue exactly where the interrupted run's were.
  void setEpoch(int64_t epoch, int64_t start);
  /// This rank's indices for the current epoch (numSamples() of them).
  std::vector<int64_t> indices() const;
  /// indices() cut into batches of `batchSize` (the last one shorter unless dropLast).
  std::vector<std::vector<int64_t>> batches(int64_t batchSize, bool dropLast = false) const;
  /// setEpoch(epoch), then batches(): a loop that cannot forget setEpoch,
  /// `for (const auto& batch : sampler.epochBatches(epoch, 64)) { ... }`.
  std::vector<std::vector<int64_t>> epochBatches(int64_t epoch, int64_t batchSize, bool dropLast = false);
  int64_t numSamples() const;
  /// numSamples() of rank `rank`: every rank knows every rank's share (pad = false).
  int64_t numSamplesOf(int rank) const;

  // Where a loop stands in the epoch (since setEpoch), in batches of `batchSize` (ConfigError < 1):
  // the arithmetic of progress bars, sample counts and resumable checkpoints.
  /// Batches every rank steps through: rank 0's count, the largest shard's (Python's
  /// len(DataLoader) on rank 0). Unpadded, the ranks one short join rank 0's last step (ddp::Join).
  int64_t batchesPerRank(int64_t batchSize, bool dropLast = false) const;
  /// The samples of batch slots [first, first + count) over all ranks, a rank short of a slot
  /// counting what it has: what the world trained on in those steps (unpadded ones too).
  int64_t samplesInBatches(int64_t first, int64_t count, int64_t batchSize) const;
  /// The epoch's position once every rank took its first `batches` batches: the `start` for
  /// setEpoch(epoch, start) that resumes right after them, at this or another world size
  /// (TrainPosition::epochSamples): start + world × batches × batchSize, at most the dataset size.
  int64_t positionAfter(int64_t batches, int64_t batchSize) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
