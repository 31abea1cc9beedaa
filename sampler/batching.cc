#include "sampler/batching.h"

#include <algorithm>

#include "common/error.h"

namespace ddp::sampler {

int64_t numBatches(int64_t numIndices, int64_t batchSize, bool dropLast) {
  if (batchSize < 1) {
    DDP_THROW(ConfigError, "batching: batch size must be >= 1, got ", batchSize);
  }
  if (numIndices < 0) {
    DDP_THROW(ConfigError, "batching: number of indices must be >= 0, got ", numIndices);
  }
  return dropLast ? numIndices / batchSize : (numIndices + batchSize - 1) / batchSize;
}

std::vector<std::vector<int64_t>> makeBatches(const std::vector<int64_t>& indices,
                                              int64_t batchSize, bool dropLast) {
  const auto total = static_cast<int64_t>(indices.size());
  const int64_t count = numBatches(total, batchSize, dropLast);
  std::vector<std::vector<int64_t>> batches;
  batches.reserve(static_cast<size_t>(count));
  for (int64_t b = 0; b < count; ++b) {
    const int64_t begin = b * batchSize;
    const int64_t end = std::min(begin + batchSize, total);
    batches.emplace_back(indices.begin() + begin, indices.begin() + end);
  }
  return batches;
}

}  // namespace ddp::sampler
