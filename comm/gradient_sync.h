// Flat post-backward gradient averaging and the start-of-training parameter
// broadcast. (Bucketed, overlapped reduction is the Reducer's job.)
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "comm/communicator.h"

namespace ddp::comm {

/// Copies `root`'s values into every rank's tensors (parameters and buffers),
/// so all replicas start equal. One collective for all tensors.
void broadcastTensors(Communicator& comm, const std::vector<at::Tensor>& tensors, int root = 0);

/// Averages the gradients of `params` over all ranks, in place: pre-divides by
/// the world size and SUM-reduces (Gloo has no AVG). Parameters without a
/// gradient contribute zeros. `extra` (e.g. the loss) rides in the same
/// buffer and is averaged too; may be undefined.
void allReduceGradients(Communicator& comm, const std::vector<at::Tensor>& params,
                        at::Tensor extra = {});

}  // namespace ddp::comm
