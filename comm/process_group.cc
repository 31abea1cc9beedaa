// The only file that talks to c10d process groups. LibTorch 1.13 has
// ProcessGroupGloo/NCCL derive from ProcessGroup, 2.x from Backend; both keep
// allreduce/broadcast/barrier with these signatures, so we hold the concrete type.
#include "comm/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef DDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/ops/ones.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "comm/shm_communicator.h"
#include "comm/timeout_census.h"
#include "common/error.h"

namespace ddp::comm {
namespace {

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Maps c10d's exceptions to our family, naming the backend, the collective and the rank.
// The census (when given) names the ranks that did not answer.
[[noreturn]] void rethrowAsCommError(const std::string& backend, const char* op, int rank,
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

std::shared_ptr<::gloo::transport::Device> makeGlooDevice(const std::string& hostname) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  return c10d::ProcessGroupGloo::createDeviceForHostname(hostname);
}

}  // namespace

c10::Device collectiveDevice(Backend backend, c10::Device rankDevice) {
  return backend == Backend::kNccl ? rankDevice : c10::Device(c10::kCPU);
}

std::unique_ptr<Communicator> makeCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                               const ProcessGroupOptions& options) {
  if (options.worldSize == 1 && !options.groupForSingleRank) return std::make_unique<LocalCommunicator>();
  DDP_ENFORCE(store, "a world of ", options.worldSize, " ranks needs a rendezvous store");
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("default_pg", store);
  // Survivors of a timeout sign in within a few seconds of each other (they wait on the same collective).
  const auto census = std::make_shared<TimeoutCensus>(
      store, options.rank, options.worldSize, std::min(options.timeout, std::chrono::milliseconds(3000)));
  try {
    switch (options.backend) {
      case Backend::kGloo: {
        auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
        opts->devices.push_back(makeGlooDevice(options.hostname));
        opts->threads = options.glooThreads;
        auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options.rank,
                                                                 options.worldSize, opts);
        return std::make_unique<C10dCommunicator<c10d::ProcessGroupGloo>>(
            std::move(group), "gloo", options.rank, options.worldSize,
            collectiveDevice(Backend::kGloo, options.device), census);
      }
      case Backend::kNccl: {
#ifdef DDP_WITH_NCCL
        DDP_ENFORCE(options.device.is_cuda() && options.device.has_index(),
                    "nccl needs the rank's GPU, got device ", options.device.str());
        // Blocking wait: wait() throws on timeout/error instead of the watchdog aborting the process.
        // 2.x reads TORCH_NCCL_BLOCKING_WAIT, 1.13 NCCL_BLOCKING_WAIT; a user's setting of either wins.
        if (!std::getenv("TORCH_NCCL_BLOCKING_WAIT") && !std::getenv("NCCL_BLOCKING_WAIT")) {
          setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 1);
          setenv("NCCL_BLOCKING_WAIT", "1", 1);
        }
        auto opts = c10d::ProcessGroupNCCL::Options::create();
        opts->timeout = options.timeout;
        auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, options.rank,
                                                                 options.worldSize, opts);
        return std::make_unique<C10dCommunicator<c10d::ProcessGroupNCCL>>(
            std::move(group), "nccl", options.rank, options.worldSize,
            collectiveDevice(Backend::kNccl, options.device), census);
#else
        break;
#endif
      }
      case Backend::kShm: {
        ShmOptions shm;
        shm.rank = options.rank;
        shm.worldSize = options.worldSize;
        shm.timeout = options.timeout;
        return makeShmCommunicator(prefixed, shm);
      }
      case Backend::kAuto:
        break;
    }
  } catch (const ddp::Error&) {
    throw;
  } catch (const std::exception& e) {
    DDP_THROW(CommError, backendName(options.backend), " process group setup failed on rank ",
              options.rank, "/", options.worldSize, ": ", firstLine(e.what()));
  }
  DDP_THROW(ConfigError, "backend '", backendName(options.backend),
            "' is not available in this build; use backend: gloo");
}

}  // namespace ddp::comm
