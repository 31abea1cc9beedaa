// ImageLoader: loader threads take the epoch's samples in order, each decoding into its row of a
// batch buffer; at most prefetchBatches + 1 batches are in flight, so memory follows the batch
// size and the prefetch depth, never the data set.
#include <ATen/ops/empty.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "ddp/image_data.h"

namespace ddp {
namespace {

// One batch being filled.
struct Slot {
  at::Tensor images;                 // [B, 3, S, S], pinned when the target is CUDA
  std::vector<std::string> errors;   // per row: empty, or the DataError's message
  int64_t remaining = 0;             // rows not written yet
};

}  // namespace

struct ImageLoader::Impl {
  std::shared_ptr<const ImageDataset> data;
  ImageLoaderOptions options;
  std::vector<std::thread> threads;

  std::mutex mutex;
  std::condition_variable workReady;  // workers: a job may be taken, or stop
  std::condition_variable batchDone;  // next(): a batch may be complete
  bool stop = false;
  int64_t generation = 0;             // bumped by start(): rows of an abandoned epoch are dropped
  int64_t epoch = 0;
  std::vector<std::vector<int64_t>> batches;
  std::vector<std::pair<int64_t, int64_t>> jobs;  // (batch, row), in batch order
  size_t nextJob = 0;
  int64_t consumed = 0;               // batches next() has returned
  std::map<int64_t, std::shared_ptr<Slot>> slots;
  int64_t skipped = 0;

  at::Tensor newBatchTensor(int64_t rows) const {
    const int64_t s = options.transform.size;
    auto o = at::TensorOptions().dtype(options.normalize ? at::kFloat : at::kByte);
    if (options.device.is_cuda()) o = o.pinned_memory(true);
    return at::empty({rows, 3, s, s}, o);
  }

  // Writes one sample's HWC bytes into row `row` of the CHW batch, normalized or as bytes.
  void store(const RgbImage& image, const at::Tensor& images, int64_t row) const {
    const int64_t plane = image.height * image.width;
    const uint8_t* px = image.pixels.data();
    if (options.normalize) {
      normalizeImage(image, images.data_ptr<float>() + row * 3 * plane, options.mean, options.stddev);
    } else {
      uint8_t* out = images.data_ptr<uint8_t>() + row * 3 * plane;
      for (int c = 0; c < 3; ++c) {
        for (int64_t p = 0; p < plane; ++p) out[c * plane + p] = px[p * 3 + c];
      }
    }
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      workReady.wait(lock, [&] {
        return stop || (nextJob < jobs.size() && jobs[nextJob].first <= consumed + options.prefetchBatches);
      });
      if (stop) return;
      const auto [b, row] = jobs[nextJob++];
      const int64_t gen = generation;
      const int64_t ep = epoch;
      const int64_t index = batches[static_cast<size_t>(b)][static_cast<size_t>(row)];
      std::shared_ptr<Slot>& entry = slots[b];
      if (!entry) {
        entry = std::make_shared<Slot>();
        const auto rows = static_cast<int64_t>(batches[static_cast<size_t>(b)].size());
        entry->images = newBatchTensor(rows);
        entry->errors.resize(static_cast<size_t>(rows));
        entry->remaining = rows;
      }
      const std::shared_ptr<Slot> slot = entry;
      lock.unlock();
      std::string error;
      try {
        const std::vector<uint8_t> bytes = data->read(index);
        const RgbImage image =
            transformImage(bytes.data(), bytes.size(), data->name(index), options.transform, options.seed, ep, index);
        store(image, slot->images, row);
      } catch (const DataError& e) {
        error = e.what();
      } catch (const std::exception& e) {
        error = std::string("data: '") + data->name(index) + "': " + e.what();
      }
      lock.lock();
      if (gen != generation) continue;
      slot->errors[static_cast<size_t>(row)] = std::move(error);
      if (--slot->remaining == 0) batchDone.notify_all();
    }
  }
};

ImageLoader::ImageLoader(std::shared_ptr<const ImageDataset> dataset, ImageLoaderOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!dataset) DDP_THROW(ConfigError, "ddp::ImageLoader: no data set");
  if (options.mean.size() != 3 || options.stddev.size() != 3) {
    DDP_THROW(ConfigError, "ddp::ImageLoader: mean and stddev need 3 values (R, G, B), got ", options.mean.size(),
              " and ", options.stddev.size());
  }
  if (options.transform.size < 1) DDP_THROW(ConfigError, "ddp::ImageLoader: image size ", options.transform.size, " < 1");
  options.threads = std::max(1, options.threads);
  options.prefetchBatches = std::max(0, options.prefetchBatches);
  impl_->data = std::move(dataset);
  impl_->options = std::move(options);
  for (int t = 0; t < impl_->options.threads; ++t) impl_->threads.emplace_back([this] { impl_->work(); });
}

ImageLoader::~ImageLoader() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->workReady.notify_all();
  for (auto& t : impl_->threads) t.join();
}

void ImageLoader::start(std::vector<std::vector<int64_t>> batches, int64_t epoch) {
  for (const auto& batch : batches) {
    for (int64_t i : batch) {
      if (i < 0 || i >= impl_->data->size()) {
        DDP_THROW(ConfigError, "ddp::ImageLoader: sample index ", i, " outside the data set of ", impl_->data->size());
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ++impl_->generation;
    impl_->epoch = epoch;
    impl_->batches = std::move(batches);
    impl_->jobs.clear();
    for (size_t b = 0; b < impl_->batches.size(); ++b) {
      for (size_t r = 0; r < impl_->batches[b].size(); ++r) {
        impl_->jobs.emplace_back(static_cast<int64_t>(b), static_cast<int64_t>(r));
      }
    }
    impl_->nextJob = 0;
    impl_->consumed = 0;
    impl_->slots.clear();
  }
  impl_->workReady.notify_all();
}

std::optional<ImageBatch> ImageLoader::next() {
  Impl& m = *impl_;
  std::shared_ptr<Slot> slot;
  std::vector<int64_t> indices;
  {
    std::unique_lock<std::mutex> lock(m.mutex);
    if (m.consumed >= static_cast<int64_t>(m.batches.size())) return std::nullopt;
    const int64_t b = m.consumed;
    indices = m.batches[static_cast<size_t>(b)];
    if (!indices.empty()) {
      m.batchDone.wait(lock, [&] {
        const auto it = m.slots.find(b);
        return it != m.slots.end() && it->second->remaining == 0;
      });
      slot = m.slots[b];
      m.slots.erase(b);
    }
    ++m.consumed;
  }
  m.workReady.notify_all();

  ImageBatch batch;
  at::Tensor images = slot ? slot->images : m.newBatchTensor(0);
  std::vector<int64_t> kept;
  std::vector<int64_t> keptRows;
  for (size_t r = 0; r < indices.size(); ++r) {
    const std::string& error = slot->errors[r];
    if (error.empty()) {
      kept.push_back(indices[r]);
      keptRows.push_back(static_cast<int64_t>(r));
      continue;
    }
    if (!m.options.skipBadImages) throw DataError(error + " (ImageLoaderOptions::skipBadImages leaves such files out)");
    spdlog::warn("skipping a bad image: {}", error);
    batch.skippedNames.push_back(m.data->name(indices[r]));
  }
  if (!batch.skippedNames.empty()) {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.skipped += static_cast<int64_t>(batch.skippedNames.size());
  }
  if (keptRows.size() != indices.size()) {
    at::Tensor compact = m.newBatchTensor(static_cast<int64_t>(keptRows.size()));
    for (size_t k = 0; k < keptRows.size(); ++k) compact[static_cast<int64_t>(k)].copy_(images[keptRows[k]]);
    images = compact;
  }
  at::Tensor labels = at::empty({static_cast<int64_t>(kept.size())}, at::TensorOptions().dtype(at::kLong).pinned_memory(
                                                                           m.options.device.is_cuda()));
  for (size_t k = 0; k < kept.size(); ++k) labels.data_ptr<int64_t>()[k] = m.data->label(kept[k]);
  if (m.options.device.is_cuda()) {
    // From pinned memory: the copies overlap the step; the caching host allocator keeps the buffer
    // until they are done.
    images = images.to(m.options.device, /*non_blocking=*/true);
    labels = labels.to(m.options.device, /*non_blocking=*/true);
  }
  batch.images = std::move(images);
  batch.labels = std::move(labels);
  batch.indices = std::move(kept);
  return batch;
}

int64_t ImageLoader::skipped() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->skipped;
}

}  // namespace ddp
