// Peak memory of this process (CPU) and of each GPU (CUDA caching allocator),
// for summary.json and the DP/DDP comparison.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace ddp::worker::dp {

/// The process's peak resident set size (VmHWM in /proc/self/status), in bytes; 0 if unknown.
int64_t peakRssBytes();

/// Peak bytes the CUDA caching allocator had allocated on `device` (PyTorch's
/// torch.cuda.max_memory_allocated); 0 for CPU devices or a LibTorch without CUDA.
int64_t cudaPeakAllocatedBytes(c10::Device device);

}  // namespace ddp::worker::dp
