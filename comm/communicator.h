// The collectives the trainer needs, behind one small interface so that the
// c10d API (which moved between LibTorch 1.13 and 2.x) is touched in one file.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

namespace ddp::comm {

/// A collective in flight. wait() returns once this rank's result is in place
/// (or throws CommError/TimeoutError); it must be called exactly once.
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

/// A group of `size()` ranks; every collective must be called by all ranks
/// in the same order, or they mismatch and hang until the timeout.
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

  /// In place: every rank ends with the element-wise sum over ranks.
  virtual void allReduceSum(at::Tensor& tensor) = 0;
  /// Starts an in-place SUM all-reduce and returns at once; `tensor` must stay
  /// alive and untouched until wait(). Works complete in launch order.
  virtual std::unique_ptr<PendingWork> allReduceSumAsync(at::Tensor& tensor) = 0;
  /// In place: every rank ends with `root`'s tensor.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  /// Returns once every rank has entered.
  virtual void barrier() = 0;
  /// Blocks until every collective this rank started has finished where it runs, within the
  /// group's timeout: NCCL's wait() only makes the compute stream wait, so this is where the host
  /// learns that a peer never joined (TimeoutError naming it, before NCCL's watchdog would abort
  /// the process). Call it before reading on the host a result that depends on GPU collectives.
  /// Backends whose wait() blocks (Gloo, shm, local) return at once.
  virtual void awaitCompletion() {}

  // The collectives users call in their own loops (ddp::ProcessGroup). The defaults are built on
  // allReduceSum, so every backend has them; backends override with their native ones.
  /// outputs[r] = rank r's `input` (every rank's input has the same shape and dtype).
  virtual std::vector<at::Tensor> allGather(const at::Tensor& input);
  /// The sum over ranks of their inputs[rank()] (inputs: size() tensors of one shape).
  virtual at::Tensor reduceScatterSum(const std::vector<at::Tensor>& inputs);
  /// outputs[r] = rank r's inputs[rank()] (inputs: size() tensors of one shape).
  virtual std::vector<at::Tensor> allToAll(const std::vector<at::Tensor>& inputs);
  /// Point to point; backends without it throw ConfigError naming one that has it.
  virtual void send(const at::Tensor& tensor, int dst);
  virtual void recv(at::Tensor& tensor, int src);
};

inline std::vector<at::Tensor> Communicator::allGather(const at::Tensor& input) {
  // One all-reduce of a zero-padded (size, n) block: exact, since x + 0 == x.
  const at::Tensor flat = input.reshape({-1});
  at::Tensor all = at::zeros({size(), flat.numel()}, flat.options().device(device()));
  all[rank()].copy_(flat);
  allReduceSum(all);
  std::vector<at::Tensor> out;
  for (int r = 0; r < size(); ++r) out.push_back(all[r].reshape(input.sizes()).to(input.device(), /*non_blocking=*/false, /*copy=*/true));
  return out;
}

inline at::Tensor Communicator::reduceScatterSum(const std::vector<at::Tensor>& inputs) {
  at::Tensor all = at::stack(inputs).to(device()).contiguous();
  allReduceSum(all);
  return all[rank()].to(inputs.front().device(), /*non_blocking=*/false, /*copy=*/true);
}

inline std::vector<at::Tensor> Communicator::allToAll(const std::vector<at::Tensor>& inputs) {
  const std::vector<at::Tensor> gathered = allGather(at::stack(inputs));
  std::vector<at::Tensor> out;
  for (int r = 0; r < size(); ++r) out.push_back(gathered[r][rank()].clone());
  return out;
}

inline void Communicator::send(const at::Tensor&, int) {
  DDP_THROW(ConfigError, "the ", backendName(), " backend has no send/recv; use backend gloo (CPU) or nccl (GPU)");
}

inline void Communicator::recv(at::Tensor&, int) {
  DDP_THROW(ConfigError, "the ", backendName(), " backend has no send/recv; use backend gloo (CPU) or nccl (GPU)");
}

/// World size 1: every collective is the identity, no network needed.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backendName() const override { return "local"; }
  void allReduceSum(at::Tensor&) override {}
  std::unique_ptr<PendingWork> allReduceSumAsync(at::Tensor&) override {
    return std::make_unique<CompletedWork>();
  }
  void broadcast(at::Tensor&, int) override {}
  void barrier() override {}
};

}  // namespace ddp::comm
