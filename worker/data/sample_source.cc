#include "worker/data/sample_source.h"

namespace ddp::worker::data {

SampleSource SampleSource::inMemory(const TensorDataset& dataset) {
  return SampleSource(dataset.size(), [&dataset](std::vector<std::vector<int64_t>> plan, LoaderOptions options) {
    return std::make_unique<BatchLoader>(dataset, std::move(plan), std::move(options));
  });
}

}  // namespace ddp::worker::data
