// LibTorch's CUDA half, loaded only by processes that use a GPU.
//
// libtorch_cuda and the CUDA libraries it pulls in (cuBLAS, cuDNN, NVRTC, ...) cost every process
// that links them ~250 MiB of resident memory and ~0.15 s at start, GPU or not. So the worker and
// our libraries link LibTorch's CPU half only; what needs CUDA symbols (ProcessGroupNCCL, the CUDA
// allocator's statistics) lives in libddp_cuda.so, which a rank loads when it takes a GPU. Loading
// it loads libtorch_cuda, whose initialisers register CUDA with LibTorch: from then on
// torch::cuda::*, .to(cuda) and CUDA generators work as in a program linked with it.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/group_options.h"

namespace ddp::comm {

class TimeoutCensus;

/// One GPU as a rank saw it (for summary.json and the end-of-run log).
struct GpuReport {
  char name[128] = {};       // "NVIDIA H100 80GB HBM3"
  char pciBusId[32] = {};    // "0000:18:00.0", the bus id nvidia-smi shows
  int64_t totalBytes = 0;
  int64_t peakAllocatedBytes = 0;  // tensors (torch.cuda.max_memory_allocated)
  int64_t peakReservedBytes = 0;   // the caching allocator's segments (max_memory_reserved)
};

/// What the plugin provides; kCudaPluginAbi changes whenever this struct or an argument does.
struct CudaPlugin {
  int abi = 0;
  std::unique_ptr<Communicator> (*makeNccl)(const c10::intrusive_ptr<c10d::Store>& prefixedStore,
                                            const ProcessGroupOptions& options,
                                            const std::shared_ptr<TimeoutCensus>& census) = nullptr;
  int64_t (*peakAllocatedBytes)(int deviceIndex) = nullptr;
  void (*report)(int deviceIndex, GpuReport* out) = nullptr;
  const char* torchVersion = nullptr;  // TORCH_VERSION of the LibTorch the plugin was built with
  /// c10::cuda::warning_state().set_sync_debug_mode (torch.cuda.set_sync_debug_mode): 0 off, 1 warn,
  /// 2 error on every call that makes the host wait for the GPU. Process-wide.
  void (*setSyncDebugMode)(int level) = nullptr;
  /// at::cuda::CUDAGraph with its own side stream on GPU `deviceIndex` (ddp::CudaGraph).
  void* (*graphCreate)(int deviceIndex) = nullptr;
  /// Runs body(ctx) on the graph's side stream (which first waits for the current stream, and the
  /// current stream for it after), capturing it into the graph when `capture` (kernels recorded,
  /// not run; thread-local capture mode, so the loader's threads may allocate pinned memory).
  void (*graphRun)(void* graph, void (*body)(void*), void* ctx, bool capture) = nullptr;
  /// Replays the captured graph on the current stream and records its end.
  void (*graphReplay)(void* graph) = nullptr;
  /// Whether the last replay has finished on the GPU (an event query: no wait).
  bool (*graphIdle)(void* graph) = nullptr;
  void (*graphDestroy)(void* graph) = nullptr;
};
inline constexpr int kCudaPluginAbi = 5;
inline constexpr const char* kCudaPluginEntry = "ddp_cuda_plugin";

/// True when this build made the plugin (a CUDA LibTorch).
bool cudaPluginBuilt();

/// Loads the plugin on first use (DDP_CUDA_PLUGIN, else libddp_cuda.so beside the running program,
/// else where the build put it) and returns it. Throws ddp::ConfigError when this build has no
/// CUDA or the library cannot be loaded (with the loader's reason), or was built with another
/// LibTorch (its version, or its libtorch_cuda.so beside another libtorch_cpu.so than ours).
const CudaPlugin& loadCudaPlugin();

/// GPUs the NVIDIA driver shows this process (libcuda.so.1: cuInit + cuDeviceGetCount, so
/// CUDA_VISIBLE_DEVICES is honoured); 0 without a driver. Loads neither LibTorch's CUDA nor the
/// plugin, so asking costs a CPU-only host nothing.
int driverGpuCount();

}  // namespace ddp::comm
