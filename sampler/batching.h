// Cutting a rank's index list into mini-batches, as torch's BatchSampler does.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::sampler {

/// Consecutive chunks of batchSize indices, in order; the last, shorter chunk is
/// kept unless dropLast (torch.utils.data.BatchSampler semantics).
/// Throws ddp::ConfigError when batchSize < 1.
std::vector<std::vector<int64_t>> makeBatches(const std::vector<int64_t>& indices,
                                              int64_t batchSize, bool dropLast);

/// How many batches makeBatches() returns for numIndices indices (len(DataLoader)).
/// Throws ddp::ConfigError when batchSize < 1 or numIndices < 0.
int64_t numBatches(int64_t numIndices, int64_t batchSize, bool dropLast);

}  // namespace ddp::sampler
