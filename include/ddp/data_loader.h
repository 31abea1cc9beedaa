// ddp::DataLoaderSampler: ddp::DistributedSampler as a LibTorch sampler, for
// torch::data::make_data_loader (PyTorch's DataLoader(sampler=DistributedSampler(...)) in C++).
#pragma once

#include <torch/data/samplers/base.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/process_group.h"
#include "ddp/sampler.h"

namespace ddp {

/// This rank's share of a data set of `datasetSize` samples, in PyTorch's DistributedSampler order
/// (shuffled from seed + epoch, padded or cut to an equal share per rank; with SamplerOptions::pad
/// false, every sample once in shares that differ by one), handed out in batches to a LibTorch data
/// loader:
///
///     ddp::DataLoaderSampler sampler(dataset.size().value(), group);
///     auto loader = torch::data::make_data_loader(dataset, sampler,  // a copy: the loader owns it
///                                                 torch::data::DataLoaderOptions(64).workers(2));
///     for (int64_t epoch = 0; epoch < epochs; ++epoch) {
///       sampler.setEpoch(epoch);  // reaches the loader's copy: copies share their state
///       for (auto& batch : *loader) { ... }
///     }
///
/// Copies share one state (epoch, position), so the copy you keep is the handle on the one the
/// loader took. A pass that starts (the loader's begin() calls reset()) after a pass over the same
/// epoch logs one warning: without setEpoch every epoch sees the same order (as in PyTorch). The
/// epoch and position are saved and loaded with an archive: after load(), the loader's next pass
/// (its begin() resets the sampler) continues that epoch from the saved position.
class DataLoaderSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  DataLoaderSampler(int64_t datasetSize, const ProcessGroup& group, SamplerOptions options = {});
  DataLoaderSampler(int64_t datasetSize, int numReplicas, int rank, SamplerOptions options = {});
  ~DataLoaderSampler() override;
  DataLoaderSampler(const DataLoaderSampler&) = default;
  DataLoaderSampler& operator=(const DataLoaderSampler&) = default;
  DataLoaderSampler(DataLoaderSampler&&) noexcept = default;
  DataLoaderSampler& operator=(DataLoaderSampler&&) noexcept = default;

  /// Call before every epoch (Python's set_epoch); takes effect at the next pass (reset()).
  void setEpoch(int64_t epoch);
  int64_t epoch() const;
  /// This rank's samples per epoch (len(sampler) in Python).
  int64_t numSamples() const;
  /// Samples handed out so far in the current pass.
  int64_t position() const;

  /// torch::data::samplers::Sampler: the loader calls these.
  /// Starts a pass over the current epoch's order; `newSize` rebuilds it for a data set of that size.
  void reset(torch::optional<size_t> newSize = torch::nullopt) override;
  /// The next `batchSize` indices of this rank's share (fewer at the end), nullopt when it is spent.
  torch::optional<std::vector<size_t>> next(size_t batchSize) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ddp
