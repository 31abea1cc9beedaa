#include "worker/train/train_order.h"

namespace ddp::worker {
namespace {

class SamplerOrder final : public TrainOrder {
 public:
  SamplerOrder(const data::TensorDataset& train, int world, int rank, const SamplerOptions& options, int64_t batchSize)
      : train_(train), sampler_(train.size(), world, rank, options), batchSize_(batchSize) {}

  int64_t epochSize() const override { return train_.size(); }
  int64_t setEpoch(int64_t epoch, int64_t start) override {
    sampler_.setEpoch(epoch, start);
    return sampler_.batchesPerRank(batchSize_);
  }
  std::vector<std::vector<int64_t>> batches() const override {
    return sampler_.batches(batchSize_, /*dropLast=*/false);
  }
  int64_t positionAfter(int64_t batches) const override { return sampler_.positionAfter(batches, batchSize_); }
  int64_t samplesInBatches(int64_t first, int64_t count) const override {
    return sampler_.samplesInBatches(first, count, batchSize_);
  }
  std::unique_ptr<data::BatchLoader> loader(std::vector<std::vector<int64_t>> plan,
                                            data::LoaderOptions options) const override {
    return std::make_unique<data::BatchLoader>(train_, std::move(plan), std::move(options));
  }

 private:
  const data::TensorDataset& train_;
  DistributedSampler sampler_;
  const int64_t batchSize_;
};

}  // namespace

std::unique_ptr<TrainOrder> samplerOrder(const data::TensorDataset& train, int world, int rank,
                                         const SamplerOptions& options, int64_t batchSize) {
  return std::make_unique<SamplerOrder>(train, world, rank, options, batchSize);
}

}  // namespace ddp::worker
