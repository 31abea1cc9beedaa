// TCP rendezvous: rank 0 serves the job's store (comm/store_server) at MASTER_ADDR:MASTER_PORT,
// bound to that address only and admitting only clients that prove the job's token; every rank
// connects (comm/ddp_store), announces itself, and all wait until the world is complete. Under
// torchrun's agent store nobody of ours serves: every rank is a client of the agent's TCPStore.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::comm {

struct RendezvousOptions {
  std::string masterAddr = "127.0.0.1";
  std::uint16_t masterPort = 29500;
  int rank = 0;
  int worldSize = 1;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // like c10d's default
  std::string timeoutName = "timeout";  // how messages name `timeout` (the program's own option)
  /// Another process already serves the store at masterAddr:masterPort (torchrun's agent,
  /// TORCHELASTIC_USE_AGENT_STORE=True, or a test harness): every rank, rank 0 too, is a client.
  bool storeServedElsewhere = false;
  /// The launcher's restart count (TORCHELASTIC_RESTART_COUNT). A store served elsewhere outlives
  /// one attempt (torchrun's static agent keeps its store across restarts), so the returned store
  /// keeps this attempt's keys under "ddp/attempt_N/", away from a failed attempt's stale ones.
  int attempt = 0;
  /// The job's token (see common/job_token.h); empty: the store admits any client.
  std::string token;
  /// Rank 0: the listening socket ddp-launch bound for it (DDP_STORE_FD), else -1 (rank 0 binds).
  int listenFd = -1;
  /// Rank 0 without listenFd: the address to bind (DDP_RDZV_BIND); empty: masterAddr.
  std::string bindAddr;
};

/// Returns a store shared by all ranks once every rank has joined; throws
/// TimeoutError naming the missing ranks, or CommError when the address is unusable.
c10::intrusive_ptr<c10d::Store> rendezvous(const RendezvousOptions& options);

/// The line for a start-up that got no answer from the store within options.timeout (LibTorch's
/// client can block past its own timeout; a caller's watchdog reports it with this). Names the
/// store, the rank and the likely cause: on a LibTorch 1.x build served by another process, the
/// store protocol that PyTorch 2.x changed.
std::string unansweredStoreMessage(const RendezvousOptions& options);

}  // namespace ddp::comm
