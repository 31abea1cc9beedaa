// The batches of an epoch, assembled ahead on loader threads (PyTorch's DataLoader num_workers /
// prefetch_factor / pin_memory, for data held in memory) and handed out in plan order.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/data/augment.h"
#include "worker/data/gather_batch.h"
#include "worker/data/tensor_dataset.h"

namespace ddp::worker::data {

struct LoaderOptions {
  int numWorkers = 0;        // threads assembling batches; 0: the caller's thread, when asked
  int prefetchBatches = 2;   // batches each thread keeps ready ahead of the consumer
  bool pinMemory = false;    // CUDA device: page-locked batches copied on a side stream
  c10::Device device{c10::kCPU};
  bool pinOnCpu = false;     // keep batches on the CPU but page-locked (mode dp scatters them to GPUs)
  AugmentOptions augment;    // uint8 images only
  uint64_t seed = 0;         // augmentation draws: (seed, epoch, sample)
  int64_t epoch = 0;
  int delayMs = 0;           // DDP_DEBUG_LOADER_DELAY: each batch takes this much longer to make
};

/// DDP_DEBUG_LOADER_DELAY="RANK:MS": rank RANK's batches each take MS milliseconds longer to make, as
/// a slow data pipeline on one rank would (to see the straggler report name it); 0 for every other
/// rank, or when unset. A malformed value is a ConfigError.
int debugLoaderDelayMs(int rank);

/// [begin, end) in batches of `batchSize` rows (the last may be shorter): evaluation's plan.
std::vector<std::vector<int64_t>> contiguousBatches(int64_t begin, int64_t end, int64_t batchSize);

/// Delivers Batch{images, labels} for plan[0], plan[1], ... on options.device. The batches are
/// those of gatherBatch(dataset, plan[i]) (after augmentation), bit for bit and in the same order,
/// whatever numWorkers is: thread w makes batches w, w + W, w + 2W, ... and next() takes them in
/// turn. With pinMemory on a CUDA device the host batch is page-locked and copied with
/// non_blocking on a side stream; the compute stream waits for that copy (an event), not the CPU.
class BatchLoader {
 public:
  /// Makes a host batch of the items of one plan entry (a source other than a TensorDataset:
  /// token windows). Called on the loader's threads, so it must be safe to call concurrently.
  using Gather = std::function<Batch(const std::vector<int64_t>& items)>;

  BatchLoader(const TensorDataset& dataset, std::vector<std::vector<int64_t>> plan, LoaderOptions options);
  /// The batches gather(plan[i]), in order, ahead on the threads as for a dataset (no augmentation).
  BatchLoader(Gather gather, std::vector<std::vector<int64_t>> plan, LoaderOptions options);
  ~BatchLoader();  // stops the threads (a batch being made is finished first)
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// The next batch on the device; throws what making it threw (e.g. DataError). Call at most
  /// plan.size() times.
  Batch next();
  /// The next batch as made on the host (page-locked with pinMemory), for a caller that copies it
  /// itself (train.cuda_graph: straight into the graph's static inputs, no device-to-device copy).
  /// next() is nextOnHost() then toDevice().
  Batch nextOnHost();
  /// `host` on options.device: with pinMemory copied on a side stream the compute stream waits for.
  Batch toDevice(Batch host) const;
  size_t size() const { return plan_.size(); }

 private:
  Batch make(size_t i) const;  // gather + augment + normalise (+ pin) on the calling thread
  void work(int worker);

  void start();

  const TensorDataset* dataset_ = nullptr;  // or gather_
  Gather gather_;
  const std::vector<std::vector<int64_t>> plan_;
  const LoaderOptions options_;
  bool pin_ = false;
  size_t nextIndex_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<size_t, Batch> ready_;
  std::map<size_t, std::exception_ptr> failed_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ddp::worker::data
