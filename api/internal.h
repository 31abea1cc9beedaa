// What the worker (which sets up its group itself: data before the process group) needs to use
// the public API over a communicator it already has. Not installed.
#pragma once

#include <c10/core/Device.h>

#include "comm/communicator.h"
#include "ddp/ddp.h"

namespace ddp::api {

/// A ProcessGroup over `comm`, which must outlive it; destroy() only marks it closed.
ProcessGroup wrapCommunicator(comm::Communicator& comm, c10::Device device, int localRank = 0, int localSize = 1);

/// The communicator behind a group.
comm::Communicator& communicatorOf(const ProcessGroup& group);

}  // namespace ddp::api
