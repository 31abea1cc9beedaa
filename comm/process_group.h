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
  /// The rank's compute device; NCCL runs its collectives there (set it current first).
  c10::Device device{c10::kCPU};
  /// World size 1 normally needs no group at all; an explicitly requested backend
  /// still gets a real one (as torch.distributed.init_process_group does).
  bool groupForSingleRank = false;
};

/// The device `backend`'s collectives take tensors on, for a rank computing on
/// `rankDevice`: that GPU for NCCL, the CPU for Gloo, shm and world size 1.
c10::Device collectiveDevice(Backend backend, c10::Device rankDevice);

/// Creates the process group over `store` (from rendezvous()). World size 1
/// returns a LocalCommunicator without touching the store (unless
/// groupForSingleRank). NCCL: wait() makes the compute stream wait, the host goes
/// on; Communicator::awaitCompletion() is where a stuck peer becomes a TimeoutError
/// naming the collective (before the watchdog's abort, which stays on).
std::unique_ptr<Communicator> makeCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                               const ProcessGroupOptions& options);

}  // namespace ddp::comm
