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
#include "comm/group_options.h"

namespace ddp::comm {

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
