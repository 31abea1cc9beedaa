// Which device a rank computes on: cuda:LOCAL_RANK when GPUs are visible, else CPU.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace ddp::worker {

/// `requested` is the config's device: auto | cpu | cuda. LOCAL_RANK indexes
/// the *visible* GPUs (after CUDA_VISIBLE_DEVICES), as in PyTorch.
c10::Device selectDevice(const std::string& requested, int localRank);

}  // namespace ddp::worker
