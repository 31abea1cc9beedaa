// The library's internals behind the public classes, shared by its sources (and by tests that
// build a public object from its parts). Not installed.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "comm/backend.h"
#include "comm/communicator.h"
#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "ddp/ddp.h"
#include "libddp/runtime/env.h"

namespace ddp {

struct GroupStart::Impl {
  int rank = 0;
  int size = 1;
  int localRank = 0;
  int localSize = 1;
  c10::Device device{c10::kCPU};
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  c10::intrusive_ptr<c10d::Store> store;  // the rendezvous store; null for a group of one
};

}  // namespace ddp

namespace ddp::internal {

/// A ProcessGroup over `comm`, which must outlive it; destroy() only marks it closed.
ProcessGroup wrapCommunicator(comm::Communicator& comm, c10::Device device, int localRank = 0, int localSize = 1);

/// Throws the one line a destroyed group gives for `what` ("a forward through the DDP wrapper"):
/// the library's objects check their group when they are made.
void checkLive(const ProcessGroup& group, const char* what);

// The start-up steps of initProcessGroup(), which the worker runs with its data in between.

/// This rank's rendezvous from the env contract: the store at MASTER_ADDR:MASTER_PORT (or torchrun's
/// agent store), the job's token. Rank 0 warns when no token protects the store.
comm::RendezvousOptions rendezvousOptions(const runtime::DistEnv& env, std::chrono::milliseconds timeout,
                                          const std::string& timeoutName);

/// comm::rendezvous() under a watchdog: a store client blocked past timeout + 5 s ends the process
/// with one line (LibTorch's client cannot be interrupted).
c10::intrusive_ptr<c10d::Store> meetAtStore(const comm::RendezvousOptions& rdv);

/// The group's options: loopback on one host, else the local address that routes to MASTER_ADDR.
comm::ProcessGroupOptions groupOptions(const runtime::DistEnv& env, comm::Backend backend, c10::Device device,
                                       std::chrono::milliseconds timeout, bool groupForSingleRank);

/// comm::makeCommunicator() under the same watchdog; rdv.timeoutName is how its line names the limit.
std::unique_ptr<comm::Communicator> createGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                const comm::ProcessGroupOptions& pg,
                                                const comm::RendezvousOptions& rdv);

}  // namespace ddp::internal
