// libddp_cuda.so: the code that needs LibTorch's CUDA libraries (see comm/cuda_plugin.h).
#include <c10/cuda/CUDACachingAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/version.h>
#ifdef DDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdio>
#include <cstdlib>

#include "comm/c10d_communicator.h"
#include "comm/cuda_plugin.h"

namespace ddp::comm {
namespace {

#ifdef DDP_WITH_NCCL
std::unique_ptr<Communicator> makeNccl(const c10::intrusive_ptr<c10d::Store>& prefixed,
                                       const ProcessGroupOptions& options,
                                       const std::shared_ptr<TimeoutCensus>& census) {
  DDP_ENFORCE(options.device.is_cuda() && options.device.has_index(),
              "nccl needs the rank's GPU, got device ", options.device.str());
  // No blocking wait (unless the user sets TORCH_NCCL_BLOCKING_WAIT): wait() makes the compute
  // stream wait for NCCL's, the host goes on, and ProcessGroupNCCL's watchdog and async error
  // handling stay on. A stuck peer is named by Communicator::awaitCompletion() at the points
  // where the host reads results (log steps, barriers), before the watchdog's timeout.
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = options.timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, options.rank, options.worldSize, opts);
  auto comm = std::make_unique<detail::C10dCommunicator<c10d::ProcessGroupNCCL>>(
      std::move(group), "nccl", options.rank, options.worldSize, options.device, census, options.timeout);
  // A collective queued while a CUDA graph captures is a node of the graph, not a work to watch.
  comm->setCaptureQuery(
      [] { return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None; });
  return comm;
}
#endif

int64_t peakAllocatedBytes(int deviceIndex) {
  // allocated_bytes[0] is the aggregate over pool kinds (StatType::AGGREGATE).
  return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(deviceIndex))
      .allocated_bytes[0]
      .peak;
}

void setSyncDebugMode(int level) {
  c10::cuda::warning_state().set_sync_debug_mode(level >= 2   ? c10::cuda::SyncDebugMode::L_ERROR
                                                 : level == 1 ? c10::cuda::SyncDebugMode::L_WARN
                                                              : c10::cuda::SyncDebugMode::L_DISABLED);
}

struct Graph {
  explicit Graph(int d) : device(d), stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d)) {}
  int device;
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAGraph graph;
  at::cuda::CUDAEvent replayed;
  bool replayedOnce = false;
};

void* graphCreate(int deviceIndex) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(deviceIndex));
  return new Graph(deviceIndex);
}

void graphRun(void* handle, void (*body)(void*), void* ctx, bool capture) {
  auto* g = static_cast<Graph*>(handle);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(g->device));
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(g->device));
  at::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(g->stream);
  {
    c10::cuda::CUDAStreamGuard onSide(g->stream);
    if (capture) {
      g->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        body(ctx);
      } catch (...) {
        try {
          g->graph.capture_end();
        } catch (...) {
        }
        try {
          g->graph.reset();
        } catch (...) {
        }
        throw;
      }
      g->graph.capture_end();
    } else {
      body(ctx);
    }
  }
  at::cuda::CUDAEvent done;
  done.record(g->stream);
  done.block(current);
}

void graphReplay(void* handle) {
  auto* g = static_cast<Graph*>(handle);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(g->device));
  g->graph.replay();
  g->replayed.record(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(g->device)));
  g->replayedOnce = true;
}

bool graphIdle(void* handle) {
  auto* g = static_cast<Graph*>(handle);
  return !g->replayedOnce || g->replayed.query();
}

void graphDestroy(void* handle) { delete static_cast<Graph*>(handle); }

void report(int deviceIndex, GpuReport* out) {
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, deviceIndex) == cudaSuccess) {
    std::snprintf(out->name, sizeof out->name, "%s", props.name);
    out->totalBytes = static_cast<int64_t>(props.totalGlobalMem);
  }
  if (cudaDeviceGetPCIBusId(out->pciBusId, sizeof out->pciBusId, deviceIndex) != cudaSuccess) out->pciBusId[0] = 0;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(deviceIndex));
  out->peakAllocatedBytes = stats.allocated_bytes[0].peak;
  out->peakReservedBytes = stats.reserved_bytes[0].peak;
}

}  // namespace
}  // namespace ddp::comm

extern "C" __attribute__((visibility("default"))) const ddp::comm::CudaPlugin* ddp_cuda_plugin() {
#ifdef DDP_WITH_NCCL
  static const ddp::comm::CudaPlugin plugin{ddp::comm::kCudaPluginAbi, &ddp::comm::makeNccl,
                                            &ddp::comm::peakAllocatedBytes, &ddp::comm::report, TORCH_VERSION,
                                            &ddp::comm::setSyncDebugMode, &ddp::comm::graphCreate,
                                            &ddp::comm::graphRun, &ddp::comm::graphReplay, &ddp::comm::graphIdle,
                                            &ddp::comm::graphDestroy};
#else
  static const ddp::comm::CudaPlugin plugin{ddp::comm::kCudaPluginAbi, nullptr, &ddp::comm::peakAllocatedBytes,
                                            &ddp::comm::report, TORCH_VERSION, &ddp::comm::setSyncDebugMode,
                                            &ddp::comm::graphCreate, &ddp::comm::graphRun, &ddp::comm::graphReplay,
                                            &ddp::comm::graphIdle, &ddp::comm::graphDestroy};
#endif
  return &plugin;
}
