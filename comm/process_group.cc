// The only file that talks to c10d process groups. LibTorch 1.13 has
// ProcessGroupGloo/NCCL derive from ProcessGroup, 2.x from Backend; both keep
// allreduce/broadcast/barrier with these signatures, so we hold the concrete type.
#include "comm/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef DDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <vector>

#include "common/error.h"

namespace ddp::comm {
namespace {

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

template <typename Group>
class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<Group> group, std::string name, int rank, int size)
      : group_(std::move(group)), name_(std::move(name)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backendName() const override { return name_; }

  void allReduceSum(at::Tensor& tensor) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    run("all_reduce", [&] { return group_->allreduce(tensors, opts); });
  }

  void broadcast(at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    run("broadcast", [&] { return group_->broadcast(tensors, opts); });
  }

  void barrier() override {
    run("barrier", [&] { return group_->barrier(); });
  }

 private:
  template <typename Launch>
  void run(const char* op, Launch&& launch) {
    try {
      auto work = launch();
      work->wait();
    } catch (const std::exception& e) {
      const std::string what = firstLine(e.what());
      const bool timedOut = what.find("imed out") != std::string::npos ||
                            what.find("imeout") != std::string::npos;
      if (timedOut) {
        DDP_THROW(TimeoutError, name_, " ", op, " on rank ", rank_, "/", size_,
                  " timed out (", what, "); another rank stopped answering or crashed");
      }
      DDP_THROW(CommError, name_, " ", op, " failed on rank ", rank_, "/", size_, ": ", what);
    }
  }

  c10::intrusive_ptr<Group> group_;
  std::string name_;
  int rank_;
  int size_;
};

std::shared_ptr<::gloo::transport::Device> makeGlooDevice(const std::string& hostname) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  return c10d::ProcessGroupGloo::createDeviceForHostname(hostname);
}

}  // namespace

std::unique_ptr<Communicator> makeCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                               const ProcessGroupOptions& options) {
  if (options.worldSize == 1) return std::make_unique<LocalCommunicator>();
  DDP_ENFORCE(store, "a world of ", options.worldSize, " ranks needs a rendezvous store");
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("default_pg", store);
  try {
    switch (options.backend) {
      case Backend::kGloo: {
        auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
        opts->devices.push_back(makeGlooDevice(options.hostname));
        opts->threads = options.glooThreads;
        auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options.rank,
                                                                 options.worldSize, opts);
        return std::make_unique<C10dCommunicator<c10d::ProcessGroupGloo>>(
            std::move(group), "gloo", options.rank, options.worldSize);
      }
      case Backend::kNccl: {
#ifdef DDP_WITH_NCCL
        auto opts = c10d::ProcessGroupNCCL::Options::create();
        opts->timeout = options.timeout;
        auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, options.rank,
                                                                 options.worldSize, opts);
        return std::make_unique<C10dCommunicator<c10d::ProcessGroupNCCL>>(
            std::move(group), "nccl", options.rank, options.worldSize);
#else
        break;
#endif
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
