#include "worker/train/train_order.h"

#include <algorithm>

namespace ddp::worker {
namespace {

class SamplerOrder final : public TrainOrder {
 public:
  SamplerOrder(data::SampleSource train, int world, int rank, const SamplerOptions& options, int64_t batchSize)
      : train_(std::move(train)), sampler_(train_.size(), world, rank, options), batchSize_(batchSize) {}

  int64_t epochSize() const override { return train_.size(); }
  int64_t setEpoch(int64_t epoch, int64_t start, int64_t /*firstMicroStep*/) override {
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
    return train_.loader(std::move(plan), std::move(options));
  }

 private:
  const data::SampleSource train_;
  DistributedSampler sampler_;
  const int64_t batchSize_;
};

class TokenOrder final : public TrainOrder {
 public:
  TokenOrder(std::shared_ptr<const TokenData> data, const TokenSamplerOptions& options)
      : data_(data), sampler_(std::move(data), options) {}

  int64_t epochSize() const override { return sampler_.epochRows(); }
  int64_t setEpoch(int64_t epoch, int64_t start, int64_t firstMicroStep) override {
    start_ = start;
    firstMicroStep_ = firstMicroStep;
    return sampler_.stepsFrom(start);
  }
  std::vector<std::vector<int64_t>> batches() const override {
    const int64_t slots = sampler_.stepsFrom(start_);
    const int64_t rows = sampler_.rowsPerStep();
    std::vector<std::vector<int64_t>> plan;
    plan.reserve(static_cast<size_t>(slots));
    for (int64_t k = 0; k < slots; ++k) {
      const int64_t consumed = start_ + k * rows;
      // The run's micro-batch count, not the epoch's row count / this world's rows per step: after a
      // resume at another world size that repeated the draws of steps already taken (1 -> 2 ranks:
      // rank 0 trained the 1-rank run's steps 6-10 again).
      plan.push_back(sampler_.windowStarts(consumed, firstMicroStep_ + k));
    }
    return plan;
  }
  int64_t positionAfter(int64_t batches) const override {
    return std::min(sampler_.epochRows(), start_ + batches * sampler_.rowsPerStep());
  }
  int64_t samplesInBatches(int64_t /*first*/, int64_t count) const override { return count * sampler_.rowsPerStep(); }
  std::unique_ptr<data::BatchLoader> loader(std::vector<std::vector<int64_t>> plan,
                                            data::LoaderOptions options) const override {
    const int64_t blockSize = sampler_.options().blockSize;
    auto gather = [data = data_, blockSize](const std::vector<int64_t>& starts) {
      TokenBatch b = data->batch(starts, blockSize);
      return data::Batch{std::move(b.x), std::move(b.y)};
    };
    return std::make_unique<data::BatchLoader>(std::move(gather), std::move(plan), std::move(options));
  }

 private:
  std::shared_ptr<const TokenData> data_;
  TokenSampler sampler_;
  int64_t start_ = 0;
  int64_t firstMicroStep_ = 0;
};

}  // namespace

std::unique_ptr<TrainOrder> tokenOrder(std::shared_ptr<const TokenData> data, const TokenSamplerOptions& options) {
  return std::make_unique<TokenOrder>(std::move(data), options);
}

std::unique_ptr<TrainOrder> samplerOrder(data::SampleSource train, int world, int rank,
                                         const SamplerOptions& options, int64_t batchSize) {
  return std::make_unique<SamplerOrder>(std::move(train), world, rank, options, batchSize);
}

}  // namespace ddp::worker
