// ddp::ProcessGroup and initProcessGroup(): the worker's start-up (env contract, device,
// authenticated rendezvous, Gloo/NCCL/shm group) for programs of their own.
#include <c10/util/Logging.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "libddp/internal.h"
#include "comm/backend.h"
#include "comm/gradient_sync.h"
#include "comm/local_address.h"
#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "common/error.h"
#include "common/job_token.h"
#include "ddp/ddp.h"
#include "libddp/runtime/device.h"
#include "libddp/runtime/env.h"
#include "libddp/runtime/startup_watchdog.h"

namespace ddp {

struct ProcessGroup::Impl {
  std::unique_ptr<comm::Communicator> owned;  // null when wrapping the worker's communicator
  comm::Communicator* comm = nullptr;
  c10::intrusive_ptr<c10d::Store> store;      // keeps rank 0's store server alive
  c10::Device device{c10::kCPU};
  int localRank = 0;
  int localSize = 1;
  // Kept so that they still answer after destroy().
  int rank = 0;
  int size = 1;
  std::string backend;
  c10::Device collectiveDevice{c10::kCPU};
  bool destroyed = false;

  void attach(comm::Communicator* c) {
    comm = c;
    rank = c->rank();
    size = c->size();
    backend = c->backendName();
    collectiveDevice = c->device();
  }

  comm::Communicator& live() {
    if (destroyed || comm == nullptr) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup used after destroy(); make a new one with ddp::initProcessGroup()");
    }
    return *comm;
  }
};

int GroupStart::rank() const { return impl_->rank; }
int GroupStart::size() const { return impl_->size; }
int GroupStart::localRank() const { return impl_->localRank; }
int GroupStart::localSize() const { return impl_->localSize; }
c10::Device GroupStart::device() const { return impl_->device; }
std::chrono::milliseconds GroupStart::timeout() const { return impl_->timeout; }

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::Impl& ProcessGroup::impl() const { return *impl_; }

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
int ProcessGroup::localRank() const { return impl_->localRank; }
int ProcessGroup::localSize() const { return impl_->localSize; }
c10::Device ProcessGroup::device() const { return impl_->device; }
std::string ProcessGroup::backend() const { return impl_->backend; }
c10::Device ProcessGroup::collectiveDevice() const { return impl_->collectiveDevice; }
bool ProcessGroup::destroyed() const { return impl_->destroyed; }

namespace {

// Runs `op` on `tensor` where the backend takes it; copies back when it had to move.
template <typename Op>
void onCollectiveDevice(comm::Communicator& comm, at::Tensor& tensor, Op op) {
  if (tensor.device() == comm.device() && tensor.is_contiguous()) {
    op(tensor);
    return;
  }
  at::Tensor moved = tensor.to(comm.device()).contiguous();
  op(moved);
  tensor.copy_(moved);
}

}  // namespace

void ProcessGroup::allReduceSum(at::Tensor& tensor) {
  auto& comm = impl_->live();
  onCollectiveDevice(comm, tensor, [&comm](at::Tensor& t) { comm.allReduceSum(t); });
}

void ProcessGroup::allReduceMean(at::Tensor& tensor) {
  allReduceSum(tensor);
  tensor.div_(size());
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  auto& comm = impl_->live();
  onCollectiveDevice(comm, tensor, [&comm, root](at::Tensor& t) { comm.broadcast(t, root); });
}

void ProcessGroup::broadcast(const std::vector<at::Tensor>& tensors, int root) {
  comm::broadcastTensors(impl_->live(), tensors, root);
}

void ProcessGroup::barrier() { impl_->live().barrier(); }

void ProcessGroup::destroy() {
  if (impl_->destroyed) return;
  impl_->live().barrier();  // no rank leaves while another may still need rank 0's store
  impl_->destroyed = true;
  impl_->owned.reset();
  impl_->store.reset();
}

ProcessGroup initProcessGroup(const InitOptions& options) {
  using namespace ddp::runtime;
  // The env contract describes one group: a second rendezvous at the same MASTER_PORT would meet
  // nobody (the launcher's listening socket is taken, the other ranks have moved on).
  static std::atomic<bool> initialised{false};
  if (initialised.exchange(true)) {
    DDP_THROW(ConfigError, "ddp::initProcessGroup() was called twice in this process; call it once and pass the "
              "ProcessGroup on (copies share the group)");
  }
  // LibTorch's own log lines (c10d's socket retries with stack traces) would bury our one-line
  // errors; only FATAL passes unless the user asks for more (TORCH_CPP_LOG_LEVEL).
  ::setenv("TORCH_CPP_LOG_LEVEL", "FATAL", /*overwrite=*/0);
  c10::initLogging();
  const DistEnv env = readDistEnv(processEnv(), options.legacyLocalRank);
  // The secret stays in this process: programs it starts do not get it, and /proc/PID/environ (the
  // initial environment block, which unsetenv leaves as it was) shows only x's where it was.
  if (char* token = ::getenv(kTokenEnv)) std::memset(token, 'x', std::strlen(token));
  ::unsetenv(kTokenEnv);
  ::unsetenv(kStoreFdEnv);
  if (options.timeout.count() <= 0) DDP_THROW(ConfigError, "ddp::InitOptions::timeout must be positive");

  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->localRank = env.localRank;
  impl->localSize = env.localWorldSize;
  const comm::Backend requested = comm::parseBackend(options.backend);
  DeviceRequest request;
  request.requested = options.device;
  request.localRank = env.localRank;
  request.localWorldSize = env.localWorldSize;
  request.ranksMayShareGpu = requested == comm::Backend::kGloo;
  impl->device = selectDevice(request);
  useDevice(impl->device);  // before any CUDA work: no rank opens a context on GPU 0
  const comm::Backend backend =
      comm::resolveBackend(requested, impl->device.is_cuda(), /*singleHost=*/env.localWorldSize == env.worldSize);
  GroupStart::Impl start;
  start.rank = env.rank;
  start.size = env.worldSize;
  start.localRank = env.localRank;
  start.localSize = env.localWorldSize;
  start.device = impl->device;
  start.timeout = options.timeout;
  // backend: nccl gets a real NCCL group even for one rank (as init_process_group does); the others
  // take the network-free path.
  const bool groupForSingleRank = requested == comm::Backend::kNccl;
  if (env.worldSize == 1 && !groupForSingleRank) {
    if (options.beforeGroup) options.beforeGroup(GroupStart(start));
    impl->owned = std::make_unique<comm::LocalCommunicator>();
    impl->attach(impl->owned.get());
    return ProcessGroup(std::move(impl));
  }

  const comm::RendezvousOptions rdv = api::rendezvousOptions(env, options.timeout, options.timeoutName);
  impl->store = api::meetAtStore(rdv);
  start.store = impl->store;
  if (options.beforeGroup) options.beforeGroup(GroupStart(start));
  const comm::ProcessGroupOptions pg =
      api::groupOptions(env, backend, impl->device, options.timeout, groupForSingleRank);
  impl->owned = api::createGroup(impl->store, pg, rdv);
  impl->attach(impl->owned.get());
  return ProcessGroup(std::move(impl));
}

namespace api {

ProcessGroup wrapCommunicator(comm::Communicator& comm, c10::Device device, int localRank, int localSize) {
  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->attach(&comm);
  impl->device = device;
  impl->localRank = localRank;
  impl->localSize = localSize;
  return ProcessGroup(std::move(impl));
}

comm::Communicator& communicatorOf(const ProcessGroup& group) { return group.impl().live(); }

comm::RendezvousOptions rendezvousOptions(const runtime::DistEnv& env, std::chrono::milliseconds timeout,
                                          const std::string& timeoutName) {
  comm::RendezvousOptions rdv;
  rdv.timeoutName = timeoutName;
  rdv.masterAddr = env.masterAddr;
  rdv.masterPort = static_cast<std::uint16_t>(env.masterPort);
  rdv.rank = env.rank;
  rdv.worldSize = env.worldSize;
  rdv.timeout = timeout;
  // torchrun's static rendezvous: its agent hosts the store at MASTER_ADDR:PORT and keeps it
  // across restarts, so each attempt keeps its keys apart.
  rdv.storeServedElsewhere = env.agentStore;
  rdv.attempt = env.restartCount;
  rdv.token = env.token;
  rdv.listenFd = env.storeFd;
  rdv.bindAddr = env.rdzvBind;
  if (env.rank == 0 && !env.agentStore && env.token.empty()) {
    spdlog::warn("the job's store at {}:{} admits any client that reaches it: no {} or {} is set (ddp-launch "
                 "sets one; see README: Security)",
                 env.rdzvBind.empty() ? env.masterAddr : env.rdzvBind, env.masterPort, kTokenEnv, kTokenFileEnv);
  }
  return rdv;
}

// Each start-up phase honours the timeout even where LibTorch's store client would block past it;
// the grace lets the phase's own, more precise error come first.
std::chrono::milliseconds phaseLimit(const comm::RendezvousOptions& rdv) { return rdv.timeout + std::chrono::seconds(5); }

c10::intrusive_ptr<c10d::Store> meetAtStore(const comm::RendezvousOptions& rdv) {
  runtime::StartupWatchdog watchdog(phaseLimit(rdv), [&rdv] { return comm::unansweredStoreMessage(rdv); });
  return comm::rendezvous(rdv);
}

comm::ProcessGroupOptions groupOptions(const runtime::DistEnv& env, comm::Backend backend, c10::Device device,
                                       std::chrono::milliseconds timeout, bool groupForSingleRank) {
  comm::ProcessGroupOptions pg;
  pg.backend = backend;
  pg.rank = env.rank;
  pg.worldSize = env.worldSize;
  pg.timeout = timeout;
  pg.device = device;
  pg.groupForSingleRank = groupForSingleRank;
  // Single node: loopback. Multi-node: the local address that routes to MASTER_ADDR
  // (GLOO_SOCKET_IFNAME overrides both).
  pg.hostname = env.localWorldSize == env.worldSize ? "127.0.0.1" : comm::localAddressFor(env.masterAddr);
  return pg;
}

std::unique_ptr<comm::Communicator> createGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                const comm::ProcessGroupOptions& pg,
                                                const comm::RendezvousOptions& rdv) {
  runtime::StartupWatchdog watchdog(phaseLimit(rdv), [&rdv, &pg] {
    return "start-up: rank " + std::to_string(rdv.rank) + " could not create its " + comm::backendName(pg.backend) +
           " process group within " + rdv.timeoutName + "=" +
           ::ddp::detail::concat(static_cast<double>(rdv.timeout.count()) / 1000.0) + " s (the store at " +
           rdv.masterAddr + ":" + std::to_string(rdv.masterPort) + " stopped answering); did another rank fail?";
  });
  auto group = comm::makeCommunicator(store, pg);
  watchdog.disarm();
  return group;
}

}  // namespace api
}  // namespace ddp
