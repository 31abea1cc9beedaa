#include "sampler/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randperm.h>

#include <algorithm>

#include "common/error.h"
#include "sampler/batching.h"

namespace ddp::sampler {
namespace {

// Python: ceil((N - R) / R) when drop_last and N % R != 0, else ceil(N / R).
// For N % R != 0 the first equals floor(N / R), also when N < R (ceil of a
// value in (-1, 0) is 0); integers avoid float rounding for huge N.
int64_t computeNumSamples(int64_t n, int64_t replicas, bool dropLast) {
  if (dropLast && n % replicas != 0) {
    return n / replicas;
  }
  return (n + replicas - 1) / replicas;
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t datasetSize, DistributedSamplerOptions options)
    : datasetSize_(datasetSize), options_(options) {
  if (datasetSize < 0) {
    DDP_THROW(ConfigError, "DistributedSampler: dataset size must be >= 0, got ", datasetSize);
  }
  if (options_.numReplicas < 1) {
    DDP_THROW(ConfigError, "DistributedSampler: numReplicas (world size) must be >= 1, got ",
              options_.numReplicas);
  }
  if (options_.rank < 0 || options_.rank >= options_.numReplicas) {
    DDP_THROW(ConfigError, "DistributedSampler: invalid rank ", options_.rank,
              ", rank should be in the interval [0, ", options_.numReplicas - 1,
              "] for numReplicas ", options_.numReplicas);
  }
  numSamples_ = numSamplesOf(options_.rank);
}

int64_t DistributedSampler::numSamplesOf(int64_t rank) const {
  if (rank < 0 || rank >= options_.numReplicas) {
    DDP_THROW(ConfigError, "DistributedSampler::numSamplesOf: rank ", rank, " is outside [0, ", options_.numReplicas - 1,
              "]");
  }
  const int64_t rest = datasetSize_ - start_;  // the positions still to deal out
  // Unpadded: the positions start + rank, start + rank + R, ... below N.
  if (unpadded()) return rest > rank ? (rest - rank + options_.numReplicas - 1) / options_.numReplicas : 0;
  return computeNumSamples(rest, options_.numReplicas, options_.dropLast);
}

void DistributedSampler::setEpoch(int64_t epoch, int64_t start) {
  if (start < 0 || start > datasetSize_) {
    DDP_THROW(ConfigError, "DistributedSampler::setEpoch: start ", start, " is outside [0, ", datasetSize_,
              "] (the positions of the epoch already consumed)");
  }
  epoch_ = epoch;
  start_ = start;
  numSamples_ = numSamplesOf(options_.rank);
}

namespace {

void checkCounts(const char* what, int64_t batchSize, int64_t first, int64_t count) {
  if (batchSize < 1) DDP_THROW(ConfigError, "DistributedSampler::", what, ": batchSize must be >= 1, got ", batchSize);
  if (first < 0 || count < 0) {
    DDP_THROW(ConfigError, "DistributedSampler::", what, ": batch counts must be >= 0, got ", first, " and ", count);
  }
}

}  // namespace

int64_t DistributedSampler::batchesPerRank(int64_t batchSize, bool dropLast) const {
  checkCounts("batchesPerRank", batchSize, 0, 0);
  return numBatches(numSamplesOf(0), batchSize, dropLast);
}

int64_t DistributedSampler::samplesInBatches(int64_t first, int64_t count, int64_t batchSize) const {
  checkCounts("samplesInBatches", batchSize, first, count);
  const int64_t from = first * batchSize;
  const int64_t to = (first + count) * batchSize;
  int64_t total = 0;
  for (int64_t r = 0; r < options_.numReplicas; ++r) {
    const int64_t n = numSamplesOf(r);
    total += std::min(n, to) - std::min(n, from);
  }
  return total;
}

int64_t DistributedSampler::positionAfter(int64_t batches, int64_t batchSize) const {
  checkCounts("positionAfter", batchSize, 0, batches);
  const int64_t taken = options_.numReplicas * batches * batchSize;
  return std::min(datasetSize_, start_ + taken);
}

std::vector<int64_t> DistributedSampler::indices() const {
  const int64_t n = datasetSize_;
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (options_.shuffle) {
    // Same as Python's g.manual_seed(seed + epoch); a negative sum wraps to the
    // same uint64 seed Python uses. A fresh CPUGeneratorImpl(seed) has the same
    // state as torch.Generator() after manual_seed(seed).
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        options_.seed + static_cast<uint64_t>(epoch_));
    const at::Tensor perm = at::randperm(n, gen);  // int64, as in Python
    const int64_t* p = perm.data_ptr<int64_t>();
    order.assign(p, p + n);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      order[static_cast<size_t>(i)] = i;
    }
  }

  // Python pads with indices[:padding] or, when padding > N, with whole copies
  // of the list; either way position p of the padded list holds order[p % N].
  // With drop_last the list is cut to totalSize <= N, where p % N == p; unpadded, p < N too.
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(numSamples_));
  for (int64_t i = 0; i < numSamples_; ++i) {
    const int64_t p = start_ + options_.rank + i * options_.numReplicas;
    mine.push_back(order[static_cast<size_t>(p % n)]);
  }
  return mine;
}

}  // namespace ddp::sampler
