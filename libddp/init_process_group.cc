// ddp::initProcessGroup(): the worker's start-up for programs of their own (env contract, device,
// authenticated rendezvous, Gloo/NCCL/shm group, InitOptions::beforeGroup), ddp::rank() and
// ddp::worldSize(), and the internal steps the worker's own start-up shares.
#include <spdlog/spdlog.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/local_address.h"
#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "common/error.h"
#include "common/flight_recorder.h"
#include "common/job_token.h"
#include "ddp/ddp.h"
#include "libddp/internal.h"
#include "libddp/process_group_impl.h"
#include "libddp/runtime/device.h"
#include "libddp/runtime/env.h"
#include "libddp/runtime/startup_watchdog.h"

namespace ddp {

namespace {

std::vector<uint8_t> bytesOf(const std::string& text) { return {text.begin(), text.end()}; }

// The rank's own error as the others rethrow it: its class (so its exit code) and its first line.
std::string verdictOf(const std::exception& e) {
  const char* kind = dynamic_cast<const ConfigError*>(&e) ? "C"
                     : dynamic_cast<const DataError*>(&e) ? "D"
                     : dynamic_cast<const CheckpointError*>(&e) ? "K" : "E";
  const std::string what = e.what();
  std::string verdict = kind;
  verdict.append(what, 0, what.find('\n'));
  return verdict;
}

[[noreturn]] void rethrowVerdict(const std::string& verdict) {
  const std::string what = verdict.substr(1) + " (rank 0's error; this rank stops with it)";
  switch (verdict.front()) {
    case 'C': throw ConfigError(what);
    case 'D': throw DataError(what);
    case 'K': throw CheckpointError(what);
    default: throw Error(what);
  }
}

// InitOptions::beforeGroup on every rank, with rank 0's outcome shared: rank 0 hosts the store, so
// were it to leave at once on its own error (a model too large, a bad data set), a rank still
// talking to the store would fail with "connection closed" (exit 1) instead of the same one line
// (exit 2). Rank 0 publishes its verdict and, on an error, waits (at most 30 s) until every rank has
// come through its own beforeGroup; a rank that succeeded rethrows rank 0's error. Costs one store
// add per rank and one wait on the other ranks, once per job.
void runBeforeGroup(const std::function<void(const GroupStart&)>& beforeGroup, const GroupStart& start,
                    c10d::Store& store, std::chrono::milliseconds timeout) {
  static const std::string kDone = "ddp/before_group/done";
  static const std::string kAll = "ddp/before_group/all";
  static const std::string kVerdict = "ddp/before_group/rank0";
  const auto checkIn = [&] {
    if (store.add(kDone, 1) == start.size()) store.set(kAll, bytesOf("1"));
  };
  try {
    beforeGroup(start);
  } catch (const std::exception& e) {
    try {
      if (start.rank() == 0) store.set(kVerdict, bytesOf(verdictOf(e)));
      checkIn();
      if (start.rank() == 0) store.wait({kAll}, std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(30)));
    } catch (const std::exception&) {
      // A rank that never comes cannot be helped: this rank's own error is what matters.
    }
    throw;
  }
  if (start.rank() == 0) {
    store.set(kVerdict, bytesOf("+"));
    checkIn();
    return;
  }
  // Read rank 0's verdict before checking in: a failed rank 0 leaves (and its store with it) as soon
  // as every rank has checked in.
  store.wait({kVerdict}, timeout);
  const std::vector<uint8_t> raw = store.get(kVerdict);
  const std::string verdict(raw.begin(), raw.end());
  checkIn();
  if (!verdict.empty() && verdict != "+") rethrowVerdict(verdict);
}

}  // namespace

namespace {

// The group initProcessGroup() made, for ddp::rank() and ddp::worldSize(); -1 until then.
std::atomic<int> worldRank{-1};
std::atomic<int> worldRanks{-1};

ProcessGroup madeByInit(std::shared_ptr<ProcessGroup::Impl> impl) {
  worldRanks = impl->size_;
  worldRank = impl->rank_;
  return ProcessGroup(std::move(impl));
}

int worldValue(const std::atomic<int>& value, const char* what) {
  const int v = value.load();
  if (v < 0) {
    DDP_THROW(ConfigError, "ddp::", what, "() before ddp::initProcessGroup(): call initProcessGroup() first (as "
              "torch.distributed's get_rank and get_world_size need init_process_group)");
  }
  return v;
}

}  // namespace

int rank() { return worldValue(worldRank, "rank"); }
int worldSize() { return worldValue(worldRanks, "worldSize"); }
bool isInitialized() { return worldRank.load() >= 0; }

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
  // A peer that dies while this rank writes to it (Gloo's sockets, the store's) would end this rank
  // by SIGPIPE, without a line and blamed for the failure; ignored, the write fails with EPIPE and
  // the collective names the peer. Only where the program kept the default.
  struct sigaction onPipe {};
  if (::sigaction(SIGPIPE, nullptr, &onPipe) == 0 && onPipe.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  if (options.timeout.count() <= 0) DDP_THROW(ConfigError, "ddp::InitOptions::timeout must be positive");
  auto impl = std::make_shared<ProcessGroup::Impl>();
  flight::Recorder& recorder = flight::Recorder::instance();  // takes the launcher's ring (and its env) now
  if (!options.hangReportDir.empty()) recorder.setReportDir(options.hangReportDir);
  impl->checkCollectives = options.checkCollectives;
  impl->timeout = options.timeout;
  const auto describe = [&](const ProcessGroup::Impl& group) {
    recorder.describeRank(env.rank, env.worldSize, group.backend, options.timeout.count());
  };

  impl->localRank = env.localRank;
  impl->localSize = env.localWorldSize;
  const comm::Backend requested = options.backend;
  if (requested == Backend::kLocal) {
    DDP_THROW(ConfigError, "ddp::InitOptions::backend is kLocal, which a group of one reports; ask for kAuto, kGloo, "
              "kNccl or kShm");
  }
  DeviceRequest request;
  request.requested = options.device;
  request.localRank = env.localRank;
  request.localWorldSize = env.localWorldSize;
  request.ranksMayShareGpu = requested == comm::Backend::kGloo;
  impl->rankDevice = selectDevice(request);
  useDevice(impl->rankDevice);  // before any CUDA work: no rank opens a context on GPU 0
  const comm::Backend backend =
      comm::resolveBackend(requested, impl->rankDevice.is_cuda(), /*singleHost=*/env.localWorldSize == env.worldSize);
  GroupStart::Impl start;
  start.rank = env.rank;
  start.size = env.worldSize;
  start.localRank = env.localRank;
  start.localSize = env.localWorldSize;
  start.device = impl->rankDevice;
  start.timeout = options.timeout;
  // backend: nccl gets a real NCCL group even for one rank (as init_process_group does); the others
  // take the network-free path.
  const bool groupForSingleRank = requested == comm::Backend::kNccl;
  if (env.worldSize == 1 && !groupForSingleRank) {
    if (options.beforeGroup) options.beforeGroup(GroupStart(start));
    impl->owned = std::make_unique<comm::LocalCommunicator>();
    impl->attach(impl->owned.get());
    describe(*impl);
    return madeByInit(std::move(impl));
  }

  const comm::RendezvousOptions rdv = internal::rendezvousOptions(env, options.timeout, options.timeoutName);
  impl->store = internal::meetAtStore(rdv);
  start.store = impl->store;
  if (options.beforeGroup) runBeforeGroup(options.beforeGroup, GroupStart(start), *impl->store, options.timeout);
  const comm::ProcessGroupOptions pg =
      internal::groupOptions(env, backend, impl->rankDevice, options.timeout, groupForSingleRank);
  impl->owned = internal::createGroup(impl->store, pg, rdv);
  impl->attach(impl->owned.get());
  impl->groupOptions = pg;
  describe(*impl);
  return madeByInit(std::move(impl));
}

namespace internal {

ProcessGroup wrapCommunicator(comm::Communicator& comm, c10::Device device, int localRank, int localSize) {
  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->attach(&comm);
  impl->rankDevice = device;
  impl->localRank = localRank;
  impl->localSize = localSize;
  return ProcessGroup(std::move(impl));
}

void checkLive(const ProcessGroup& group, const char* what) { group.impl().live(what); }

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
                 "sets one; see docs/security.md)",
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
    return "start-up: rank " + std::to_string(rdv.rank) + " could not create its " + backendName(pg.backend) +
           " process group within " + rdv.timeoutName + "=" +
           ::ddp::detail::concat(static_cast<double>(rdv.timeout.count()) / 1000.0) + " s (the store at " +
           rdv.masterAddr + ":" + std::to_string(rdv.masterPort) + " stopped answering); did another rank fail?";
  });
  auto group = comm::makeCommunicator(store, pg);
  watchdog.disarm();
  return group;
}

}  // namespace internal
}  // namespace ddp
