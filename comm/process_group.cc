// The only file that talks to c10d process groups. LibTorch 1.13 has
// ProcessGroupGloo/NCCL derive from ProcessGroup, 2.x from Backend; both keep
// allreduce/broadcast/barrier with these signatures, so we hold the concrete type.
#include "comm/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <ATen/ops/ones.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
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

// Gloo's transport threads throw gloo::EnforceNotMet where nothing can catch it: a rank that
// receives another size than it posted ("op.preamble.length <= op.nbytes", a collective the ranks
// call with different sizes). std::terminate then aborted the process with "terminate called" and
// LibTorch's trace (SIGABRT). One line instead, exit 1: the launcher's report names the collectives.
std::terminate_handler previousTerminate = nullptr;

[[noreturn]] void onTerminate() {
  if (const std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      const std::string what = firstLine(e.what());
      if (what.rfind("[enforce fail at ", 0) == 0 && what.find("gloo/") != std::string::npos) {
        std::fprintf(stderr,
                     "ddp: a Gloo transport thread failed (%s): the ranks' collectives do not pair (one rank "
                     "sends another size than the other receives); comm.check_collectives "
                     "(InitOptions::checkCollectives) names both calls\n",
                     what.c_str());
        std::fflush(stderr);
        ::_exit(1);
      }
    } catch (...) {
    }
  }
  if (previousTerminate != nullptr) previousTerminate();
  std::abort();
}

void sayGlooTransportFailures() {
  static std::once_flag once;
  std::call_once(once, [] { previousTerminate = std::set_terminate(onTerminate); });
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
        sayGlooTransportFailures();
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
