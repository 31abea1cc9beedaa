// C10dCommunicator: our Communicator over a c10d process group (Gloo here, NCCL in the CUDA
// plugin), with c10d's exceptions mapped to our family. Internal to comm/ and the plugin.
#pragma once

#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>
#include <string>
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
  C10dPendingWork(WorkPtr work, std::string backend, int rank, int size, std::shared_ptr<TimeoutCensus> census)
      : work_(std::move(work)), backend_(std::move(backend)), rank_(rank), size_(size), census_(std::move(census)) {}
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
      work->wait();
    } catch (const std::exception& e) {
      rethrowAsCommError(backend_, "all_reduce", rank_, size_, e, census_);
    }
  }

 private:
  WorkPtr work_;
  std::string backend_;
  int rank_;
  int size_;
  std::shared_ptr<TimeoutCensus> census_;
};

template <typename Group>
class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<Group> group, std::string name, int rank, int size,
                   c10::Device device, std::shared_ptr<TimeoutCensus> census)
      : group_(std::move(group)), name_(std::move(name)), rank_(rank), size_(size), device_(device),
        census_(std::move(census)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backendName() const override { return name_; }
  c10::Device device() const override { return device_; }

  void allReduceSum(at::Tensor& tensor) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    run("all_reduce", [&] { return group_->allreduce(tensors, opts); });
  }

  std::unique_ptr<PendingWork> allReduceSumAsync(at::Tensor& tensor) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    try {
      auto work = group_->allreduce(tensors, opts);
      return std::make_unique<C10dPendingWork<decltype(work)>>(std::move(work), name_, rank_,
                                                               size_, census_);
    } catch (const std::exception& e) {
      rethrowAsCommError(name_, "all_reduce", rank_, size_, e);
    }
  }

  void broadcast(at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    run("broadcast", [&] { return group_->broadcast(tensors, opts); });
  }

  std::vector<at::Tensor> allGather(const at::Tensor& input) override {
    std::vector<at::Tensor> inputs{input.contiguous()};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size_; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
    run("all_gather", [&] { return group_->allgather(outputs, inputs); });
    return outputs[0];
  }

  void send(const at::Tensor& tensor, int dst) override {
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    run("send", [&] { return group_->send(tensors, dst, /*tag=*/0); });
  }

  void recv(at::Tensor& tensor, int src) override {
    std::vector<at::Tensor> tensors{tensor};
    run("recv", [&] { return group_->recv(tensors, src, /*tag=*/0); });
  }

  void barrier() override {
    if (device_.is_cpu()) {
      run("barrier", [&] { return group_->barrier(); });
      return;
    }
    // NCCL's own barrier guesses the GPU and returns before the GPU is done:
    // a one-element all-reduce on our device, read back, blocks for real.
    at::Tensor token = at::ones({1}, at::TensorOptions().device(device_));
    allReduceSum(token);
    try {
      (void)token.item<float>();
    } catch (const std::exception& e) {
      rethrowAsCommError(name_, "barrier", rank_, size_, e, census_);
    }
  }

 private:
  template <typename Launch>
  void run(const char* op, Launch&& launch) {
    try {
      auto work = launch();
      work->wait();
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
};

}  // namespace ddp::comm::detail
