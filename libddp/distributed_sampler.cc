// ddp::DistributedSampler over the sampler layer's (sampler/distributed_sampler.h).
#include "ddp/sampler.h"

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "libddp/sampler_options.h"
#include "sampler/batching.h"
#include "sampler/distributed_sampler.h"

namespace ddp {

struct DistributedSampler::Impl {
  sampler::DistributedSampler sampler;
  bool shuffle = true;
  // batches() handed out the current epoch's order since the last setEpoch: a second pass over it
  // is the classic forgotten set_epoch (every epoch the same order). Said once.
  bool passed = false;
  bool warned = false;
};

DistributedSampler::DistributedSampler(int64_t datasetSize, const ProcessGroup& group, SamplerOptions options)
    : DistributedSampler(datasetSize, group.size(), group.rank(), options) {}

DistributedSampler::DistributedSampler(int64_t datasetSize, int numReplicas, int rank, SamplerOptions options)
    : impl_(std::make_unique<Impl>(
          Impl{sampler::DistributedSampler(datasetSize, internal::samplerOptions(numReplicas, rank, options)),
               options.shuffle})) {}

DistributedSampler::~DistributedSampler() = default;
DistributedSampler::DistributedSampler(DistributedSampler&&) noexcept = default;
DistributedSampler& DistributedSampler::operator=(DistributedSampler&&) noexcept = default;

void DistributedSampler::setEpoch(int64_t epoch) {
  impl_->sampler.setEpoch(epoch);
  impl_->passed = false;
}
void DistributedSampler::setEpoch(int64_t epoch, int64_t start) {
  impl_->sampler.setEpoch(epoch, start);
  impl_->passed = false;
}
std::vector<int64_t> DistributedSampler::indices() const { return impl_->sampler.indices(); }
int64_t DistributedSampler::numSamples() const { return impl_->sampler.numSamples(); }
int64_t DistributedSampler::numSamplesOf(int rank) const { return impl_->sampler.numSamplesOf(rank); }
int64_t DistributedSampler::batchesPerRank(int64_t batchSize, bool dropLast) const {
  return impl_->sampler.batchesPerRank(batchSize, dropLast);
}
int64_t DistributedSampler::samplesInBatches(int64_t first, int64_t count, int64_t batchSize) const {
  return impl_->sampler.samplesInBatches(first, count, batchSize);
}
int64_t DistributedSampler::positionAfter(int64_t batches, int64_t batchSize) const {
  return impl_->sampler.positionAfter(batches, batchSize);
}

std::vector<std::vector<int64_t>> DistributedSampler::batches(int64_t batchSize, bool dropLast) const {
  if (batchSize < 1) DDP_THROW(ConfigError, "ddp::DistributedSampler::batches: batchSize must be >= 1 (got ", batchSize, ")");
  if (impl_->passed && impl_->shuffle && !impl_->warned) {
    impl_->warned = true;
    spdlog::warn("ddp::DistributedSampler: batches() again without setEpoch, so this pass sees the same order as the "
                 "last (epoch {}); call sampler.setEpoch(epoch) before each epoch (PyTorch's set_epoch), or take "
                 "sampler.epochBatches(epoch, batchSize)", impl_->sampler.epoch());
  }
  impl_->passed = true;
  return sampler::makeBatches(indices(), batchSize, dropLast);
}

std::vector<std::vector<int64_t>> DistributedSampler::epochBatches(int64_t epoch, int64_t batchSize, bool dropLast) {
  setEpoch(epoch);
  return batches(batchSize, dropLast);
}

}  // namespace ddp
