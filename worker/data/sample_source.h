// A split the loop reads batches of: held in memory (a TensorDataset, gathered per batch) or
// streamed from image files (read and decoded per batch, data.stream). The sampler, the loader and
// evaluation see only its size and the batches it makes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/data/batch_loader.h"
#include "worker/data/tensor_dataset.h"

namespace ddp::worker::data {

class SampleSource {
 public:
  /// The loader of a plan of sample indices (LoaderOptions: threads, prefetch, pinning, the
  /// augmentation's seed and epoch).
  using MakeLoader = std::function<std::unique_ptr<BatchLoader>(std::vector<std::vector<int64_t>>, LoaderOptions)>;

  /// `dataset` must outlive the source.
  static SampleSource inMemory(const TensorDataset& dataset);
  SampleSource(int64_t size, MakeLoader make) : size_(size), make_(std::move(make)) {}

  int64_t size() const { return size_; }
  std::unique_ptr<BatchLoader> loader(std::vector<std::vector<int64_t>> plan, LoaderOptions options) const {
    return make_(std::move(plan), std::move(options));
  }

 private:
  int64_t size_ = 0;
  MakeLoader make_;
};

}  // namespace ddp::worker::data
