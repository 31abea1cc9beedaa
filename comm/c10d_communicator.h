// C10dCommunicator: our Communicator over a c10d process group (Gloo here, NCCL in the CUDA
// plugin), with c10d's exceptions mapped to our family. Internal to comm/ and the plugin.
#pragma once

#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/timeout_census.h"
#include "common/error.h"

namespace ddp::comm::detail {

inline std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Maps c10d's exceptions to our family, naming the backend, the collective and the rank.
// The census (when given) names the ranks that did not answer.
[[noreturn]] inline void rethrowAsCommError(const std::string& backend, const char* op, int rank,
                                     int size, const std::exception& e,
                                     const std::shared_ptr<TimeoutCensus>& census = nullptr) {
  const std::string what = firstLine(e.what());
  const bool timedOut =
      what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
  // Every rank whose collective failed takes part, not only those that timed out: Gloo closes a
  // timed-out rank's connections, so its peers fail at once with "connection closed"; were they to
  // leave without signing in, the store (rank 0's) could be gone before the others ask it.
  const std::string missing = census ? census->missingRanks() : "";
  if (timedOut) {
    DDP_THROW(TimeoutError, backend, " ", op, " on rank ", rank, "/", size, " timed out (", what, ")",
              missing.empty() ? std::string("; another rank stopped answering or crashed")
                              : " (" + missing + "); that rank stopped answering or crashed");
  }
  DDP_THROW(CommError, backend, " ", op, " failed on rank ", rank, "/", size, ": ", what,
            missing.empty() ? std::string() : " (" + missing + ")");
}

// WorkPtr is c10::intrusive_ptr<ProcessGroup::Work> in 1.13 and <c10d::Work> in 2.x.
template <typename WorkPtr>
class C10dPendingWork final : public PendingWork {
 public:
  // `waitLimit`: how long wait() waits (0: as long as the collective's own timeout). LibTorch 1.13's
  // Gloo ignores a per-call timeout in the options; wait(timeout) honours it in both.
  C10dPendingWork(WorkPtr work, const char* op, std::string backend, int rank, int size,
                  std::shared_ptr<TimeoutCensus> census, std::chrono::milliseconds waitLimit)
      : work_(std::move(work)), op_(op), backend_(std::move(backend)), rank_(rank), size_(size),
        census_(std::move(census)), waitLimit_(waitLimit) {}
  ~C10dPendingWork() override {
    // Never abandon a collective the peers are running: its buffer would be freed under it.
    if (work_) {
      try {
        work_->wait();
      } catch (...) {
      }
    }
  }
  void wait() override {
    auto work = std::move(work_);
    if (!work) return;
    try {
      if (waitLimit_.count() > 0) {
        work->wait(waitLimit_);
      } else {
        work->wait();
      }
    } catch (const std::exception& e) {
      rethrowAsCommError(backend_, op_, rank_, size_, e, census_);
    }
  }

 private:
  WorkPtr work_;
  const char* op_;
  std::chrono::milliseconds waitLimit_;
  std::string backend_;
  int rank_;
  int size_;
  std::shared_ptr<TimeoutCensus> census_;
};

// The collectives a GPU rank queued whose end the host has not seen yet, each with when it was
// queued and what it was: NCCL's wait() only makes the compute stream wait, so this is what
// awaitCompletion() watches. Completion is polled (cudaEventQuery through isCompleted(): no
// synchronising call); the deadline comes before the watchdog's (which counts from the same
// moment), so our line naming the missing rank wins over its abort.
template <typename WorkPtr>
class InFlight {
 public:
  explicit InFlight(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  /// `timeout`: this collective's (0 = the group's; never more than the group's, where the
  /// watchdog aborts).
  void add(const char* op, WorkPtr work, std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    const auto limit = timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_;
    std::lock_guard<std::mutex> lock(mutex_);
    queued_.push_back({op, std::move(work), std::chrono::steady_clock::now(), ++count_, limit});
    // Keep the list short between waits: drop what has finished from its front.
    if (queued_.size() > 64) dropFinished();
  }

  // Polls until everything queued has finished; throws TimeoutError past the deadline of the
  // oldest unfinished one, CommError when NCCL reported an error for one.
  template <typename OnTimeout, typename OnError>
  void awaitAll(OnTimeout&& onTimeout, OnError&& onError) {
    for (auto pause = std::chrono::microseconds(20);; pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
      std::unique_lock<std::mutex> lock(mutex_);
      std::exception_ptr failed;
      const char* failedOp = nullptr;
      try {
        dropFinished();
      } catch (...) {
        failed = std::current_exception();
        failedOp = queued_.front().op;
        queued_.clear();
      }
      if (failed) {
        lock.unlock();
        try {
          std::rethrow_exception(failed);
        } catch (const std::exception& e) {
          onError(failedOp, e);
        }
      }
      if (queued_.empty()) return;
      const auto& oldest = queued_.front();
      const auto waited = std::chrono::steady_clock::now() - oldest.queuedAt;
      if (waited >= deadline(oldest.timeout)) {
        const char* op = oldest.op;
        const uint64_t number = oldest.number;
        const double seconds = std::chrono::duration<double>(waited).count();
        queued_.clear();
        lock.unlock();
        onTimeout(op, number, seconds);
        return;
      }
      lock.unlock();
      std::this_thread::sleep_for(pause);
    }
  }

 private:
  struct Queued {
    const char* op;
    WorkPtr work;
    std::chrono::steady_clock::time_point queuedAt;
    uint64_t number;
    std::chrono::milliseconds timeout;
  };
  // Before the watchdog's timeout: 5 % of it, at least 0.1 s, at most 10 s earlier.
  static std::chrono::milliseconds deadline(std::chrono::milliseconds timeout) {
    const auto margin = std::clamp(timeout / 20, std::chrono::milliseconds(100), std::chrono::milliseconds(10000));
    return std::max(timeout - margin, timeout / 2);
  }
  // Throws the work's exception (NCCL's error) when it has one.
  void dropFinished() {
    while (!queued_.empty() && queued_.front().work->isCompleted()) {
      if (auto error = queued_.front().work->exception()) std::rethrow_exception(error);
      queued_.pop_front();
    }
  }

  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // the reducer queues from autograd's threads
  std::deque<Queued> queued_;
  uint64_t count_ = 0;
};

// c10d's reduction for ours (kAvg is the front's: a sum, then a division).
inline c10d::ReduceOp toC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kProduct: return c10d::ReduceOp::PRODUCT;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kAvg: break;
  }
  DDP_THROW(ConfigError, "internal: the backends take kSum, kProduct, kMin or kMax (got ", reduceOpName(op), ")");
}

// c10d's per-call timeout: unset (the group's) for 0.
template <typename Options>
void setTimeout(Options& opts, std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) opts.timeout = timeout;
}

template <typename Group>
class C10dCommunicator final : public Communicator {
  using WorkPtr = decltype(std::declval<Group&>().barrier());

 public:
  C10dCommunicator(c10::intrusive_ptr<Group> group, std::string name, int rank, int size,
                   c10::Device device, std::shared_ptr<TimeoutCensus> census,
                   std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : group_(std::move(group)), name_(std::move(name)), rank_(rank), size_(size), device_(device),
        census_(std::move(census)), queuesOnGpu_(name_ == "nccl"), inFlight_(timeout) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backendName() const override { return name_; }
  c10::Device device() const override { return device_; }

  std::unique_ptr<PendingWork> allReduce(at::Tensor& tensor, const AllReduceOptions& options) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = toC10d(options.op);
    setTimeout(opts, options.timeout);
    return start("all_reduce", options.timeout, [&] { return group_->allreduce(tensors, opts); });
  }

  std::unique_ptr<PendingWork> broadcast(at::Tensor& tensor, const BroadcastOptions& options) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = options.root;
    setTimeout(opts, options.timeout);
    return start("broadcast", options.timeout, [&] { return group_->broadcast(tensors, opts); });
  }

  std::unique_ptr<PendingWork> allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                         const CollectiveOptions& options) override {
    std::vector<at::Tensor> inputs{input.contiguous()};
    std::vector<std::vector<at::Tensor>> lists(1);
    for (int r = 0; r < size_; ++r) lists[0].push_back(at::empty_like(inputs[0]));
    outputs = lists[0];  // the same tensors: c10d fills them
    // Nothing to send (every rank's input is as empty: all_gather's sizes agree); LibTorch 1.13's
    // Gloo divides by zero (SIGFPE) on it.
    if (inputs[0].numel() == 0) return std::make_unique<CompletedWork>();
    c10d::AllgatherOptions opts;
    setTimeout(opts, options.timeout);
    return start("all_gather", options.timeout, [&] { return group_->allgather(lists, inputs, opts); });
  }

  std::unique_ptr<PendingWork> reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                             const ReduceScatterOptions& options) override {
    if (!queuesOnGpu_) return Communicator::reduceScatter(output, inputs, options);  // Gloo: built on all_reduce
    std::vector<std::vector<at::Tensor>> lists{{}};
    for (const at::Tensor& t : inputs) lists[0].push_back(t.contiguous());
    std::vector<at::Tensor> outputs{at::empty_like(lists[0].front())};
    output = outputs[0];
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = toC10d(options.op);
    setTimeout(opts, options.timeout);
    return start("reduce_scatter", options.timeout, [&] { return group_->reduce_scatter(outputs, lists, opts); });
  }

  std::unique_ptr<PendingWork> send(const at::Tensor& tensor, int dst, const CollectiveOptions&) override {
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    return start("send", {}, [&] { return group_->send(tensors, dst, /*tag=*/0); });
  }

  std::unique_ptr<PendingWork> recv(at::Tensor& tensor, int src, const CollectiveOptions&) override {
    std::vector<at::Tensor> tensors{tensor};
    return start("recv", {}, [&] { return group_->recv(tensors, src, /*tag=*/0); });
  }

  std::unique_ptr<PendingWork> barrier(const CollectiveOptions& options) override {
    if (device_.is_cpu()) {
      c10d::BarrierOptions opts;
      setTimeout(opts, options.timeout);
      return start("barrier", options.timeout, [&] { return group_->barrier(opts); });
    }
    // NCCL's own barrier guesses the GPU and returns before the GPU is done:
    // a one-element all-reduce on our device, read back, blocks for real.
    return std::make_unique<DeferredWork>([this, options] {
      at::Tensor token = at::ones({1}, at::TensorOptions().device(device_));
      AllReduceOptions sum;
      sum.timeout = options.timeout;
      allReduce(token, sum)->wait();
      awaitCompletion();
      try {
        (void)token.item<float>();
      } catch (const std::exception& e) {
        rethrowAsCommError(name_, "barrier", rank_, size_, e, census_);
      }
    });
  }

  /// NCCL: how to tell that the current stream is capturing a CUDA graph (its collectives are then
  /// graph nodes, not works to watch).
  void setCaptureQuery(bool (*capturing)()) { capturing_ = capturing; }

  void awaitCompletion() override {
    if (!queuesOnGpu_) return;  // Gloo (CUDA tensors too): its wait() already blocked
    inFlight_.awaitAll(
        [&](const char* op, uint64_t number, double seconds) {
          const std::string missing = census_ ? census_->missingRanks() : "";
          DDP_THROW(TimeoutError, name_, " ", op, " on rank ", rank_, "/", size_, " timed out: it was queued ",
                    seconds, " s ago (collective ", number, " of this rank's GPU queue) and has not finished",
                    missing.empty() ? std::string("; another rank stopped answering or crashed")
                                    : " (" + missing + "); that rank stopped answering or crashed");
        },
        [&](const char* op, const std::exception& e) { rethrowAsCommError(name_, op, rank_, size_, e, census_); });
  }

 private:
  // Launches a c10d collective; NCCL's is watched until it has run on the GPU (awaitCompletion).
  template <typename Launch>
  std::unique_ptr<PendingWork> start(const char* op, std::chrono::milliseconds timeout, Launch&& launch) {
    try {
      auto work = launch();
      if (queuesOnGpu_ && !(capturing_ && capturing_())) inFlight_.add(op, work, timeout);
      // NCCL's wait(timeout) would block the host: its per-call limit is the watch's (above).
      const auto waitLimit = queuesOnGpu_ ? std::chrono::milliseconds(0) : timeout;
      return std::make_unique<C10dPendingWork<WorkPtr>>(std::move(work), op, name_, rank_, size_, census_, waitLimit);
    } catch (const std::exception& e) {
      rethrowAsCommError(name_, op, rank_, size_, e, census_);
    }
  }

  c10::intrusive_ptr<Group> group_;
  std::string name_;
  int rank_;
  int size_;
  c10::Device device_;
  std::shared_ptr<TimeoutCensus> census_;
  bool queuesOnGpu_;  // NCCL: wait() returns before the collective has run
  bool (*capturing_)() = nullptr;
  InFlight<WorkPtr> inFlight_;
};

}  // namespace ddp::comm::detail
