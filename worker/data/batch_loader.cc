#include "worker/data/batch_loader.h"

#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "common/error.h"

namespace ddp::worker::data {

std::vector<std::vector<int64_t>> contiguousBatches(int64_t begin, int64_t end, int64_t batchSize) {
  DDP_ENFORCE(batchSize > 0, "contiguousBatches: batch size must be > 0");
  std::vector<std::vector<int64_t>> plan;
  for (int64_t i = begin; i < end; i += batchSize) {
    std::vector<int64_t> rows(static_cast<size_t>(std::min(batchSize, end - i)));
    for (size_t k = 0; k < rows.size(); ++k) rows[k] = i + static_cast<int64_t>(k);
    plan.push_back(std::move(rows));
  }
  return plan;
}

int debugLoaderDelayMs(int rank) {
  const char* value = std::getenv("DDP_DEBUG_LOADER_DELAY");
  if (value == nullptr || *value == '\0') return 0;
  const std::string text(value);
  const auto colon = text.find(':');
  std::size_t used = 0;
  int who = -1;
  int ms = -1;
  try {
    if (colon != std::string::npos) {
      who = std::stoi(text.substr(0, colon), &used);
      if (used == colon) ms = std::stoi(text.substr(colon + 1), &used);
    }
  } catch (const std::exception&) {
    ms = -1;
  }
  if (colon == std::string::npos || ms < 0 || ms > 60000 || who < 0 || used + colon + 1 != text.size()) {
    DDP_THROW(ConfigError, "DDP_DEBUG_LOADER_DELAY is '", text, "'; use RANK:MS, e.g. 1:80 (rank 1's batches take "
              "80 ms longer), MS from 0 to 60000");
  }
  return who == rank ? ms : 0;
}

BatchLoader::BatchLoader(const TensorDataset& dataset, std::vector<std::vector<int64_t>> plan, LoaderOptions options)
    : dataset_(&dataset), plan_(std::move(plan)), options_(std::move(options)) {
  if (options_.augment.any() && (dataset.images.scalar_type() != at::kByte || dataset.images.dim() != 4)) {
    DDP_THROW(ConfigError, "config: 'data.rotate_degrees', 'data.crop_padding' and 'data.horizontal_flip' augment "
              "uint8 images [N, C, H, W], but this data set's images are ", dataset.images.scalar_type(),
              "; turn them off, or store the pixels as uint8");
  }
  start();
}

BatchLoader::BatchLoader(Gather gather, std::vector<std::vector<int64_t>> plan, LoaderOptions options)
    : gather_(std::move(gather)), plan_(std::move(plan)), options_(std::move(options)) {
  if (options_.augment.any()) DDP_THROW(ConfigError, "config: image augmentation needs images; this data set has none");
  start();
}

void BatchLoader::start() {
  DDP_ENFORCE(options_.numWorkers >= 0 && options_.prefetchBatches >= 1, "BatchLoader: bad worker options");
  // Page-locked memory only pays (and only exists) for copies to a GPU.
  pin_ = options_.pinMemory && (options_.device.is_cuda() || options_.pinOnCpu);
  for (int w = 0; w < options_.numWorkers; ++w) threads_.emplace_back([this, w] { work(w); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& t : threads_) t.join();
}

Batch BatchLoader::make(size_t i) const {
  c10::NoGradGuard noGrad;
  // A slow pipeline simulated (debugLoaderDelayMs), not a synchronisation.
  if (options_.delayMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options_.delayMs));
  const std::vector<int64_t>& rows = plan_[i];
  Batch b;
  if (gather_) {
    b = gather_(rows);
  } else if (options_.augment.any()) {
    const at::Tensor raw = gatherBatch(dataset_->images, rows);
    at::Tensor out = at::empty(raw.sizes(), at::kByte);
    const int64_t c = raw.size(1), h = raw.size(2), w = raw.size(3), per = c * h * w;
    for (size_t k = 0; k < rows.size(); ++k) {
      augmentImage(raw.data_ptr<uint8_t>() + static_cast<int64_t>(k) * per,
                   out.data_ptr<uint8_t>() + static_cast<int64_t>(k) * per, c, h, w, options_.augment, options_.seed,
                   options_.epoch, rows[k]);
    }
    b = Batch{modelInput(*dataset_, out), gatherBatch(dataset_->labels, rows)};
  } else {
    b = gatherBatch(*dataset_, rows);
  }
  if (pin_) {
    b.images = b.images.pin_memory();
    b.labels = b.labels.pin_memory();
  }
  return b;
}

Batch BatchLoader::toDevice(Batch host) const {
  const c10::Device device = options_.device;
  if (device.is_cpu()) return host;
  if (!pin_) return Batch{host.images.to(device), host.labels.to(device)};
  // The copy runs on a side stream; the compute stream (current) waits for it on the GPU only.
  auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  const c10::Stream compute = impl->getStream(device);
  const c10::Stream side = impl->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  Batch onDevice;
  {
    c10::StreamGuard onSide(side);
    onDevice.images = host.images.to(device, /*non_blocking=*/true);
    onDevice.labels = host.labels.to(device, /*non_blocking=*/true);
  }
  c10::Event copied(device.type());
  copied.record(side);
  copied.block(compute);
  // Made on the side stream, used on the compute stream: the caching allocator must know.
  impl->recordDataPtrOnStream(onDevice.images.storage().data_ptr(), compute);
  impl->recordDataPtrOnStream(onDevice.labels.storage().data_ptr(), compute);
  return onDevice;
}

void BatchLoader::work(int worker) {
  const auto workers = static_cast<size_t>(options_.numWorkers);
  for (size_t i = static_cast<size_t>(worker); i < plan_.size(); i += workers) {
    {
      // Stay at most prefetchBatches of this thread's own batches ahead of the consumer.
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] {
        return stopping_ || i < nextIndex_ + workers * static_cast<size_t>(options_.prefetchBatches);
      });
      if (stopping_) return;
    }
    try {
      Batch b = make(i);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(i, std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      failed_.emplace(i, std::current_exception());
    }
    changed_.notify_all();
  }
}

Batch BatchLoader::next() { return toDevice(nextOnHost()); }

Batch BatchLoader::nextOnHost() {
  DDP_ENFORCE(nextIndex_ < plan_.size(), "BatchLoader: all ", plan_.size(), " batches were taken");
  const size_t i = nextIndex_;
  Batch host;
  if (threads_.empty()) {
    host = make(i);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return ready_.count(i) != 0 || failed_.count(i) != 0; });
    if (auto f = failed_.find(i); f != failed_.end()) std::rethrow_exception(f->second);
    host = std::move(ready_.at(i));
    ready_.erase(i);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++nextIndex_;
  }
  changed_.notify_all();
  return host;
}

}  // namespace ddp::worker::data
