// Single-host CPU collectives through one shared-memory segment: ranks copy
// into their slot, each reduces its share of every chunk, all copy the result
// out. No sockets, no extra threads: memcpy speed where Gloo's TCP loopback
// manages a tenth of it.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>

#include "comm/communicator.h"

namespace ddp::comm {

struct ShmOptions {
  int rank = 0;
  int worldSize = 1;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // per collective
  size_t chunkBytes = 4u << 20;  // per-rank slot; larger tensors go through in chunks (all-gather and
                                 // reduce-scatter: of half a slot, the halves in turn)
};

/// Creates (rank 0) or opens (others) the job's segment, named through `store`;
/// rank 0 unlinks it once everyone has it mapped, so a crash leaves nothing behind.
std::unique_ptr<Communicator> makeShmCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                  const ShmOptions& options);

}  // namespace ddp::comm
