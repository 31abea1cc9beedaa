// The only file that talks to c10d process groups. LibTorch 1.13 has
// ProcessGroupGloo/NCCL derive from ProcessGroup, 2.x from Backend; both keep
// allreduce/broadcast/barrier with these signatures, so we hold the concrete type.
#include "comm/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <ATen/ops/ones.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "comm/c10d_communicator.h"
#include "comm/cuda_plugin.h"
#include "comm/shm_communicator.h"
#include "comm/timeout_census.h"
#include "common/error.h"

namespace ddp::comm {
namespace {

using detail::C10dCommunicator;
using detail::firstLine;

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
        if (!cudaPluginBuilt() || !ncclCompiled()) break;
        return loadCudaPlugin().makeNccl(prefixed, options, census);
      }
      case Backend::kShm: {
        ShmOptions shm;
        shm.rank = options.rank;
        shm.worldSize = options.worldSize;
        shm.timeout = options.timeout;
        return makeShmCommunicator(prefixed, shm);
      }
      case Backend::kAuto:
      case Backend::kLocal:
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
