// ddp::DataLoaderSampler: the project's DistributedSampler (PyTorch's order) behind LibTorch's
// Sampler interface, with the state shared by copies so setEpoch reaches the loader's copy.
#include "ddp/data_loader.h"

#include <spdlog/spdlog.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <mutex>

#include "common/error.h"
#include "libddp/sampler_options.h"
#include "sampler/distributed_sampler.h"

namespace ddp {

struct DataLoaderSampler::State {
  sampler::DistributedSamplerOptions options;
  sampler::DistributedSampler sampler;
  std::vector<int64_t> indices;  // the current pass's share
  size_t cursor = 0;
  int64_t epoch = 0;             // setEpoch's; the pass in progress uses `passEpoch`
  int64_t passEpoch = -1;        // -1: no pass yet
  bool warned = false;
  bool loaded = false;           // load() set the position: the next reset() keeps it
  std::mutex mutex;

  State(int64_t size, const sampler::DistributedSamplerOptions& o) : options(o), sampler(size, o) {}

  void startPass() {
    sampler.setEpoch(epoch);
    indices = sampler.indices();
    cursor = 0;
    passEpoch = epoch;
  }
};

DataLoaderSampler::DataLoaderSampler(int64_t datasetSize, const ProcessGroup& group, SamplerOptions options)
    : DataLoaderSampler(datasetSize, group.size(), group.rank(), options) {}

DataLoaderSampler::DataLoaderSampler(int64_t datasetSize, int numReplicas, int rank, SamplerOptions options)
    : state_(std::make_shared<State>(datasetSize, internal::samplerOptions(numReplicas, rank, options))) {}

DataLoaderSampler::~DataLoaderSampler() = default;

void DataLoaderSampler::setEpoch(int64_t epoch) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->epoch = epoch;
}

int64_t DataLoaderSampler::epoch() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->epoch;
}

int64_t DataLoaderSampler::numSamples() const { return state_->sampler.numSamples(); }

int64_t DataLoaderSampler::position() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<int64_t>(state_->cursor);
}

void DataLoaderSampler::reset(torch::optional<size_t> newSize) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  if (newSize.has_value() && static_cast<int64_t>(*newSize) != s.sampler.datasetSize()) {
    s.sampler = sampler::DistributedSampler(static_cast<int64_t>(*newSize), s.options);
    s.loaded = false;  // a position in another data set's order means nothing here
  }
  // The loader's begin() resets its sampler: after load() that pass continues where the saved one was.
  if (s.loaded && s.epoch == s.passEpoch) {
    s.loaded = false;
    return;
  }
  s.loaded = false;
  // A pass that handed out batches, then a new pass over the same epoch: the classic forgotten
  // set_epoch (every epoch the same order). Said once; a deliberate repeat stays possible.
  if (s.passEpoch == s.epoch && s.cursor > 0 && !s.warned && s.options.shuffle) {
    s.warned = true;
    spdlog::warn("ddp::DataLoaderSampler: a new pass over the data started in epoch {} again, so it sees the same "
                 "order as the last one; call sampler.setEpoch(epoch) before each epoch (PyTorch's set_epoch)",
                 s.epoch);
  }
  s.startPass();
}

torch::optional<std::vector<size_t>> DataLoaderSampler::next(size_t batchSize) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  if (s.passEpoch < 0) s.startPass();  // used without the loader's reset()
  if (batchSize == 0) DDP_THROW(ConfigError, "ddp::DataLoaderSampler::next: batchSize must be >= 1");
  if (s.cursor >= s.indices.size()) return torch::nullopt;
  const size_t end = std::min(s.indices.size(), s.cursor + batchSize);
  std::vector<size_t> batch;
  batch.reserve(end - s.cursor);
  for (size_t i = s.cursor; i < end; ++i) batch.push_back(static_cast<size_t>(s.indices[i]));
  s.cursor = end;
  return batch;
}

void DataLoaderSampler::save(torch::serialize::OutputArchive& archive) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  archive.write("epoch", torch::tensor(state_->passEpoch < 0 ? state_->epoch : state_->passEpoch, torch::kInt64),
                /*is_buffer=*/true);
  archive.write("index", torch::tensor(static_cast<int64_t>(state_->cursor), torch::kInt64), /*is_buffer=*/true);
}

void DataLoaderSampler::load(torch::serialize::InputArchive& archive) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto epoch = torch::empty(1, torch::kInt64);
  auto index = torch::empty(1, torch::kInt64);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("index", index, /*is_buffer=*/true);
  State& s = *state_;
  s.epoch = epoch.item<int64_t>();
  s.startPass();
  const int64_t at = index.item<int64_t>();
  if (at < 0 || at > static_cast<int64_t>(s.indices.size())) {
    DDP_THROW(ConfigError, "ddp::DataLoaderSampler::load: the archive's position ", at, " is outside this rank's ",
              s.indices.size(), " samples; was it saved for another data set or world size?");
  }
  s.cursor = static_cast<size_t>(at);
  s.loaded = true;
}

}  // namespace ddp
