// DistributedSampler: which dataset indices each rank visits in an epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::sampler {

/// Mirrors the arguments of torch.utils.data.distributed.DistributedSampler.
struct DistributedSamplerOptions {
  int64_t numReplicas = 1;  // world size; must be >= 1
  int64_t rank = 0;         // in [0, numReplicas)
  bool shuffle = true;      // reshuffle every epoch with seed + epoch
  uint64_t seed = 0;        // must be equal on every rank
  bool dropLast = false;    // false: pad by repeating the head; true: drop the tail
  bool pad = true;          // with dropLast false: pad (PyTorch); false: no index twice, rank r
                            // gets ceil((N - r) / numReplicas) (uneven shards, for Join)
};

/// Bit-identical to PyTorch's DistributedSampler (torch/utils/data/distributed.py):
/// for the same (datasetSize, options, epoch) every rank gets the same index list as
/// Python, so a C++ and a Python rank can share one job and checkpoints resume alike.
class DistributedSampler {
 public:
  /// Throws ddp::ConfigError when datasetSize < 0, numReplicas < 1 or rank is
  /// outside [0, numReplicas). A dataset of size 0 gives empty epochs, as in Python.
  DistributedSampler(int64_t datasetSize, DistributedSamplerOptions options);

  /// Selects the epoch whose shuffle indices() returns; call before every epoch
  /// or every epoch sees the same order (as with Python's set_epoch).
  /// `start`: how many positions of the epoch's permutation were already consumed (by a run of
  /// any world size, e.g. before a resume); the rest, positions start, start + 1, ..., is dealt
  /// out to this world's ranks round-robin (padded with the permutation's head, or dropped, or
  /// unpadded, as the options say). 0: PyTorch's epoch. Throws ConfigError outside [0, size].
  void setEpoch(int64_t epoch, int64_t start = 0);
  int64_t epoch() const { return epoch_; }
  int64_t start() const { return start_; }

  /// This rank's dataset indices for the current epoch, numSamples() of them.
  std::vector<int64_t> indices() const;

  /// Indices per rank per epoch (Python's len(sampler)).
  int64_t numSamples() const { return numSamples_; }
  /// numSamples() of rank `rank` (they differ only with pad = false: by at most one, the lower
  /// ranks holding more).
  int64_t numSamplesOf(int64_t rank) const;
  /// The epoch's length over all ranks: numSamples() * numReplicas, padded or truncated
  /// (pad = false: the dataset size).
  int64_t totalSize() const { return unpadded() ? datasetSize_ - start_ : numSamples_ * options_.numReplicas; }
  int64_t datasetSize() const { return datasetSize_; }

  // Where a training loop stands in the epoch, in batches of `batchSize` (ConfigError when < 1).
  /// Batches every rank steps through this epoch: rank 0's count, its shard being the largest (the
  /// others' are as large, padded, or one short, unpadded, and join rank 0's last step).
  int64_t batchesPerRank(int64_t batchSize, bool dropLast = false) const;
  /// The samples of batch slots [first, first + count) summed over the ranks, a rank short of a
  /// slot counting what it has: what the world trained on in those steps.
  int64_t samplesInBatches(int64_t first, int64_t count, int64_t batchSize) const;
  /// The epoch's position once every rank took its first `batches` batches: the `start` of
  /// setEpoch() that continues after them, start + numReplicas × batches × batchSize, at most the
  /// dataset size (rank r takes positions start + r, start + r + R, ..., so those taken are a prefix).
  int64_t positionAfter(int64_t batches, int64_t batchSize) const;
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  bool unpadded() const { return !options_.dropLast && !options_.pad; }

  int64_t datasetSize_;
  DistributedSamplerOptions options_;
  int64_t numSamples_;
  int64_t epoch_ = 0;
  int64_t start_ = 0;
};

}  // namespace ddp::sampler
