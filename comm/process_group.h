// Factory for the communicator a job uses: Gloo on CPU, NCCL on CUDA, and a
// network-free LocalCommunicator for world size 1.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/backend.h"
#include "comm/communicator.h"

namespace ddp::comm {

struct ProcessGroupOptions {
  Backend backend = Backend::kGloo;  // already resolved: gloo or nccl
  int rank = 0;
  int worldSize = 1;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // per collective
  /// Address Gloo binds to; loopback for single-node jobs. GLOO_SOCKET_IFNAME overrides.
  std::string hostname = "127.0.0.1";
  int glooThreads = 2;  // like Python's ProcessGroupGloo default
};

/// Creates the process group over `store` (from rendezvous()). World size 1
/// returns a LocalCommunicator without touching the store.
std::unique_ptr<Communicator> makeCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                               const ProcessGroupOptions& options);

}  // namespace ddp::comm
