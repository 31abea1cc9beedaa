// What a communicator is made with (comm/process_group.h makes it; the CUDA plugin's NCCL too).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <string>

#include "comm/backend.h"

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

}  // namespace ddp::comm
