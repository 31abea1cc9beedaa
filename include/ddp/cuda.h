// The GPUs of this process, for programs that link LibTorch's CPU half only (the CUDA half comes
// with libddp_cuda.so, loaded on first use; a host without a GPU driver never loads it): how many
// there are, what they are and how much memory training took (torch.cuda.device_count,
// get_device_properties, max_memory_allocated), and torch.cuda.set_sync_debug_mode.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ddp {

/// torch.cuda.device_count(): the GPUs this process sees (after CUDA_VISIBLE_DEVICES); 0 on a host
/// without a GPU driver or GPU, or in a build without CUDA.
int cudaDeviceCount();

/// One GPU as nvidia-smi and torch.cuda.memory_stats() describe it.
struct GpuReport {
  std::string name;               // "NVIDIA H100 80GB HBM3"
  std::string pciBusId;           // "0000:18:00.0", as nvidia-smi shows it
  int64_t totalBytes = 0;         // the device's memory
  int64_t peakAllocatedBytes = 0; // tensors at their peak (torch.cuda.max_memory_allocated)
  int64_t peakReservedBytes = 0;  // the caching allocator's segments (max_memory_reserved)
};

/// `device`'s report; nullopt for a device that is not a GPU, or in a build without CUDA.
/// ConfigError for `cuda` without an index, or when LibTorch's CUDA half cannot be loaded.
std::optional<GpuReport> gpuReport(c10::Device device);

/// torch.cuda.max_memory_allocated(device); 0 for a device that is not a GPU or a build without CUDA.
/// ConfigError as gpuReport's.
int64_t cudaMaxMemoryAllocated(c10::Device device);

/// torch.cuda.set_sync_debug_mode: what an operation that makes the host wait for the GPU does.
enum class CudaSyncDebugMode {
  kDefault = 0,  // nothing
  kWarn = 1,     // a warning per synchronizing call
  kError = 2,    // an error (c10::Error) from the synchronizing call
};

/// Sets the mode for this process's CUDA work. ConfigError in a build without CUDA.
void setCudaSyncDebugMode(CudaSyncDebugMode mode);

}  // namespace ddp
