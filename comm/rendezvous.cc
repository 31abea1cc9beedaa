#include "comm/rendezvous.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <torch/version.h>

#include <thread>
#include <vector>

#include "comm/ddp_store.h"
#include "common/store_server.h"
#include "common/error.h"
#include "common/job_token.h"
#include "common/listen_socket.h"
#include "common/rank_list.h"

namespace ddp::comm {
namespace {

std::string joinedKey(int rank) { return "ddp/rendezvous/rank/" + std::to_string(rank); }
constexpr const char* kCountKey = "ddp/rendezvous/count";

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// LibTorch 1.x's store client and PyTorch 2.x's store server number their requests differently
// (2.x added a validation request first): a 1.x rank under a 2.x torchrun gets no answer.
std::string protocolHint(const RendezvousOptions& options) {
#if TORCH_VERSION_MAJOR < 2
  if (options.storeServedElsewhere) {
    return "; this worker is built on LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
           std::to_string(TORCH_VERSION_MINOR) +
           ", whose store client cannot talk to a PyTorch 2.x store (torchrun 2.x serves one): start the "
           "job with ddp-launch, or build the worker against the PyTorch that runs torchrun";
  }
#endif
  (void)options;
  return "";
}

// torchrun's agent serves a c10d TCPStore: every rank, rank 0 too, is its client.
c10::intrusive_ptr<c10d::Store> connectToAgentStore(const RendezvousOptions& options) {
  const std::string where = options.masterAddr + ":" + std::to_string(options.masterPort);
  c10d::TCPStoreOptions storeOptions;
  storeOptions.port = options.masterPort;
  storeOptions.isServer = false;
  storeOptions.numWorkers = options.worldSize;
  // We count joins ourselves so a timeout can name the missing ranks.
  storeOptions.waitWorkers = false;
  storeOptions.timeout = options.timeout;

  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(options.masterAddr, storeOptions);
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason = reason.substr(0, reason.find('\n'));
    DDP_THROW(TimeoutError, "rendezvous: rank ", options.rank, " could not reach the launcher's store at ", where,
              " within ", seconds(options.timeout), " s (", reason,
              "); is the launcher running and MASTER_ADDR reachable?", protocolHint(options));
  }
  return c10::make_intrusive<c10d::PrefixStore>("ddp/attempt_" + std::to_string(options.attempt), store);
}

// Rank 0 serves the job's store on the socket ddp-launch handed it, or on one it binds itself.
std::shared_ptr<StoreServer> serveStore(const RendezvousOptions& options) {
  try {
    ListenSocket socket = options.listenFd >= 0
                              ? ListenSocket::adopt(options.listenFd, kStoreFdEnv)
                              : ListenSocket(options.bindAddr.empty() ? options.masterAddr : options.bindAddr,
                                             options.masterPort);
    if (socket.port() != options.masterPort) {
      DDP_THROW(ConfigError, kStoreFdEnv, "=", options.listenFd, " listens on port ", socket.port(),
                ", not MASTER_PORT=", options.masterPort, "; unset ", kStoreFdEnv, " or fix MASTER_PORT");
    }
    StoreServerOptions serverOptions;
    serverOptions.token = options.token;
    const int fd = socket.release();
    serverOptions.keepAlive = std::make_shared<ListenSocket>(std::move(socket));
    return std::make_shared<StoreServer>(fd, serverOptions);
  } catch (const ConfigError& e) {
    DDP_THROW(CommError, "rendezvous: rank 0 ", e.what());
  }
}

c10::intrusive_ptr<c10d::Store> connectToJobStore(const RendezvousOptions& options) {
  const std::string where = options.masterAddr + ":" + std::to_string(options.masterPort);
  std::shared_ptr<StoreServer> server;
  if (options.rank == 0) server = serveStore(options);
  DdpStoreOptions client;
  client.host = options.masterAddr;
  client.port = options.masterPort;
  client.token = options.token;
  client.timeout = options.timeout;
  try {
    return c10::make_intrusive<DdpStore>(client, server);
  } catch (const StoreAuthError& e) {
    DDP_THROW(ConfigError, "rendezvous: rank ", options.rank, ": ", e.what(),
              "; every rank needs the job's token: ddp-launch gives it to its workers, and a job started "
              "otherwise needs the same DDP_RDZV_TOKEN_FILE on every rank (docs/security.md)");
  } catch (const StoreUnreachableError& e) {
    DDP_THROW(TimeoutError, "rendezvous: rank ", options.rank, " could not reach rank 0 at ", where, " within ",
              seconds(options.timeout), " s (", e.reason(), "); is rank 0 running and MASTER_ADDR reachable?");
  } catch (const CommError& e) {
    DDP_THROW(CommError, "rendezvous: rank ", options.rank, ": ", e.what());
  }
}

}  // namespace

namespace {

constexpr int kCensusBlock = 1024;  // join keys asked about in one request

// Appends the ranks of [lo, hi) whose join key is missing: one request for the whole block when
// every rank of it joined, else one per rank, until `deadline` (the rest are counted, not named).
void findAbsent(c10d::Store& store, int lo, int hi, std::chrono::steady_clock::time_point deadline,
                std::vector<int>& absent) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(hi - lo));
  for (int r = lo; r < hi; ++r) keys.push_back(joinedKey(r));
  if (store.check(keys)) return;
  for (int r = lo; r < hi && std::chrono::steady_clock::now() < deadline; ++r) {
    if (!store.check({keys[static_cast<size_t>(r - lo)]})) absent.push_back(r);
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Store> rendezvous(const RendezvousOptions& options) {
  DDP_ENFORCE(options.worldSize >= 1 && options.rank >= 0 && options.rank < options.worldSize,
              "rank ", options.rank, " world size ", options.worldSize);
  const std::string where = options.masterAddr + ":" + std::to_string(options.masterPort);
  c10::intrusive_ptr<c10d::Store> store;
  if (!options.storeServedElsewhere) {
    store = connectToJobStore(options);
  } else {
    store = connectToAgentStore(options);
  }

  try {
    store->set(joinedKey(options.rank), std::vector<uint8_t>{1});
    store->add(kCountKey, 1);
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    auto pause = std::chrono::milliseconds(1);
    while (true) {
      const int64_t joined = store->add(kCountKey, 0);
      if (joined >= options.worldSize) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        // A few round trips at any world size (one per rank at 100 000 ranks outlasted the watchdog).
        std::vector<int> absent;
        const auto censusEnd = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        for (int lo = 0; lo < options.worldSize && std::chrono::steady_clock::now() < censusEnd; lo += kCensusBlock) {
          findAbsent(*store, lo, std::min(options.worldSize, lo + kCensusBlock), censusEnd, absent);
        }
        const int missingCount = static_cast<int>(options.worldSize - std::min<int64_t>(store->add(kCountKey, 0), options.worldSize));
        std::string missing = rankRanges(absent);
        if (static_cast<int>(absent.size()) < missingCount) {
          missing += (absent.empty() ? "" : ", ") + std::string("... (") +
                     std::to_string(missingCount - static_cast<int>(absent.size())) + " more ranks)";
        }
        DDP_THROW(TimeoutError, "rendezvous timed out after ", seconds(options.timeout), " s: ",
                  options.worldSize - missingCount, "/", options.worldSize,
                  " ranks joined (missing: ", missing, "). Did every rank start with WORLD_SIZE=",
                  options.worldSize, " and MASTER_ADDR/MASTER_PORT=", where, "?");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  } catch (const ddp::Error&) {
    throw;
  } catch (const std::exception& e) {
    // Rank 0 hosts the store: when it gives up (or dies) the others lose the connection.
    std::string reason = e.what();
    const char* host = options.storeServedElsewhere ? "the launcher" : "rank 0";
    DDP_THROW(CommError, "rendezvous: rank ", options.rank, " lost the connection to the store at ",
              where, " (", reason.substr(0, reason.find('\n')), "); did ", host, " fail or time out?",
              protocolHint(options));
  }
  return store;
}

std::string unansweredStoreMessage(const RendezvousOptions& options) {
  const std::string where = options.masterAddr + ":" + std::to_string(options.masterPort);
  const bool served = options.rank == 0 && !options.storeServedElsewhere;
  const std::string hint = protocolHint(options);
  return "start-up: rank " + std::to_string(options.rank) + " got no answer from the store at " + where +
         (served ? " (its own)" : options.storeServedElsewhere ? " (served by the launcher)" : " (served by rank 0)") +
         " within " + options.timeoutName + "=" + detail::concat(seconds(options.timeout)) + " s" +
         (hint.empty() ? "; is it a c10d store of the same PyTorch version, and is every rank's network up?"
                       : hint);
}

}  // namespace ddp::comm
