// Peak memory of this process, for summary.json and the DP/DDP comparison (a GPU's: ddp::gpuReport).
#pragma once

#include <cstdint>

namespace ddp::worker::dp {

/// The process's peak resident set size (VmHWM in /proc/self/status), in bytes; 0 if unknown.
int64_t peakRssBytes();

}  // namespace ddp::worker::dp
