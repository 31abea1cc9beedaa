// libddp_cuda.so: the code that needs LibTorch's CUDA libraries (see comm/cuda_plugin.h).
#include <c10/cuda/CUDACachingAllocator.h>
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
  // Blocking wait: wait() throws on timeout/error instead of the watchdog aborting the process.
  // 2.x reads TORCH_NCCL_BLOCKING_WAIT, 1.13 NCCL_BLOCKING_WAIT; a user's setting of either wins.
  if (!std::getenv("TORCH_NCCL_BLOCKING_WAIT") && !std::getenv("NCCL_BLOCKING_WAIT")) {
    ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 1);
    ::setenv("NCCL_BLOCKING_WAIT", "1", 1);
  }
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = options.timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, options.rank, options.worldSize, opts);
  return std::make_unique<detail::C10dCommunicator<c10d::ProcessGroupNCCL>>(
      std::move(group), "nccl", options.rank, options.worldSize, options.device, census);
}
#endif

int64_t peakAllocatedBytes(int deviceIndex) {
  // allocated_bytes[0] is the aggregate over pool kinds (StatType::AGGREGATE).
  return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(deviceIndex))
      .allocated_bytes[0]
      .peak;
}

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
                                            &ddp::comm::peakAllocatedBytes, &ddp::comm::report, TORCH_VERSION};
#else
  static const ddp::comm::CudaPlugin plugin{ddp::comm::kCudaPluginAbi, nullptr, &ddp::comm::peakAllocatedBytes,
                                            &ddp::comm::report, TORCH_VERSION};
#endif
  return &plugin;
}
