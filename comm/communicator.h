// The collectives the trainer needs, behind one small interface so that the
// c10d API (which moved between LibTorch 1.13 and 2.x) is touched in one file.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "ddp/collectives.h"

namespace ddp::comm {

/// A collective in flight. wait() returns once this rank's result is in place (or throws
/// CommError/TimeoutError); a second wait() returns at once. Destroyed unwaited, it still lets its
/// collective finish (the peers run it too): its tensors are never freed under it.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
};

/// A PendingWork that is already done (world size 1, empty tensors).
class CompletedWork final : public PendingWork {
 public:
  void wait() override {}
};

/// A collective that runs when it is waited for (or destroyed), on the waiting thread: for
/// backends whose collectives block (shm). Works are waited in launch order on every rank, so the
/// collectives still line up.
class DeferredWork final : public PendingWork {
 public:
  explicit DeferredWork(std::function<void()> run) : run_(std::move(run)) {}
  ~DeferredWork() override {
    try {
      DeferredWork::wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (auto run = std::move(run_)) run();
  }

 private:
  std::function<void()> run_;
};

/// `first`, then `next` once it has finished (outputs copied out of a staging buffer, a division).
class ThenWork final : public PendingWork {
 public:
  ThenWork(std::unique_ptr<PendingWork> first, std::function<void()> next)
      : first_(std::move(first)), next_(std::move(next)) {}
  ~ThenWork() override { first_.reset(); }  // waits for the collective; `next` is skipped
  void wait() override {
    if (auto first = std::move(first_)) first->wait();
    if (auto next = std::move(next_)) next();
  }

 private:
  std::unique_ptr<PendingWork> first_;
  std::function<void()> next_;
};

/// A group of `size()` ranks: a backend (c10d's Backend). Every collective starts and returns its
/// work (wait() for the result: `comm.allReduce(t)->wait()`); every rank must call the same
/// collectives in the same order, or they mismatch and hang until the timeout. Reductions take
/// kSum, kProduct, kMin and kMax (kAvg is the front's: a sum, then a division). Options' labels
/// are the front's business; backends honour the timeout where they can.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backendName() const = 0;
  /// Where this group's collectives take their tensors: the rank's GPU for
  /// NCCL (it accepts CUDA tensors only), the CPU otherwise. Control
  /// collectives (flags, counters, the used-parameter map) allocate here.
  virtual c10::Device device() const { return c10::Device(c10::kCPU); }

  /// In place: every rank ends with the reduction over ranks.
  virtual std::unique_ptr<PendingWork> allReduce(at::Tensor& tensor, const AllReduceOptions& options = {}) = 0;
  /// In place: every rank ends with the root's tensor.
  virtual std::unique_ptr<PendingWork> broadcast(at::Tensor& tensor, const BroadcastOptions& options = {}) = 0;
  /// Done once every rank has entered.
  virtual std::unique_ptr<PendingWork> barrier(const CollectiveOptions& options = {}) = 0;
  /// Blocks until every collective this rank started has finished where it runs, within the
  /// group's timeout: NCCL's wait() only makes the compute stream wait, so this is where the host
  /// learns that a peer never joined (TimeoutError naming it, before NCCL's watchdog would abort
  /// the process). Call it before reading on the host a result that depends on GPU collectives.
  /// Backends whose wait() blocks (Gloo, shm, local) return at once.
  virtual void awaitCompletion() {}

  // The defaults are built on allReduce, so every backend has them; backends override with their
  // native ones. Outputs are the caller's: they must outlive the work.
  /// outputs (resized to size()): outputs[r] = rank r's `input` (same shape and dtype everywhere).
  virtual std::unique_ptr<PendingWork> allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                                 const CollectiveOptions& options = {});
  /// output = the reduction over ranks of their inputs[rank()] (inputs: size() tensors of one shape).
  virtual std::unique_ptr<PendingWork> reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                                     const ReduceScatterOptions& options = {});
  /// outputs[r] = rank r's inputs[rank()] (inputs: size() tensors of one shape).
  virtual std::unique_ptr<PendingWork> allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                                const CollectiveOptions& options = {});
  /// Point to point; backends without it throw ConfigError naming one that has it.
  virtual std::unique_ptr<PendingWork> send(const at::Tensor& tensor, int dst, const CollectiveOptions& options = {});
  virtual std::unique_ptr<PendingWork> recv(at::Tensor& tensor, int src, const CollectiveOptions& options = {});
};

inline std::unique_ptr<PendingWork> Communicator::allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                                            const CollectiveOptions& options) {
  // One all-reduce of a zero-padded (size, n) block: exact, since x + 0 == x.
  const at::Tensor flat = input.reshape({-1});
  auto all = std::make_shared<at::Tensor>(at::zeros({size(), flat.numel()}, flat.options().device(device())));
  (*all)[rank()].copy_(flat);
  AllReduceOptions sum;
  sum.timeout = options.timeout;
  outputs.assign(static_cast<size_t>(size()), at::Tensor());
  return std::make_unique<ThenWork>(allReduce(*all, sum), [this, all, &outputs, input] {
    for (int r = 0; r < size(); ++r) {
      outputs[r] = (*all)[r].reshape(input.sizes()).to(input.device(), /*non_blocking=*/false, /*copy=*/true);
    }
  });
}

inline std::unique_ptr<PendingWork> Communicator::reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                                                const ReduceScatterOptions& options) {
  auto all = std::make_shared<at::Tensor>(at::stack(inputs).to(device()).contiguous());
  AllReduceOptions reduce(options.op);
  reduce.timeout = options.timeout;
  return std::make_unique<ThenWork>(allReduce(*all, reduce), [this, all, &output, target = inputs.front().device()] {
    output = (*all)[rank()].to(target, /*non_blocking=*/false, /*copy=*/true);
  });
}

inline std::unique_ptr<PendingWork> Communicator::allToAll(std::vector<at::Tensor>& outputs,
                                                           const std::vector<at::Tensor>& inputs,
                                                           const CollectiveOptions& options) {
  auto gathered = std::make_shared<std::vector<at::Tensor>>();
  return std::make_unique<ThenWork>(allGather(*gathered, at::stack(inputs), options), [this, gathered, &outputs] {
    outputs.clear();
    for (int r = 0; r < size(); ++r) outputs.push_back((*gathered)[r][rank()].clone());
  });
}

inline std::unique_ptr<PendingWork> Communicator::send(const at::Tensor&, int, const CollectiveOptions&) {
  DDP_THROW(ConfigError, "the ", backendName(), " backend has no send/recv; use backend gloo (CPU) or nccl (GPU)");
}

inline std::unique_ptr<PendingWork> Communicator::recv(at::Tensor&, int, const CollectiveOptions&) {
  DDP_THROW(ConfigError, "the ", backendName(), " backend has no send/recv; use backend gloo (CPU) or nccl (GPU)");
}

/// World size 1: every collective is the identity, no network needed.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backendName() const override { return "local"; }
  std::unique_ptr<PendingWork> allReduce(at::Tensor&, const AllReduceOptions&) override {
    return std::make_unique<CompletedWork>();
  }
  std::unique_ptr<PendingWork> broadcast(at::Tensor&, const BroadcastOptions&) override {
    return std::make_unique<CompletedWork>();
  }
  std::unique_ptr<PendingWork> barrier(const CollectiveOptions&) override { return std::make_unique<CompletedWork>(); }
};

}  // namespace ddp::comm
