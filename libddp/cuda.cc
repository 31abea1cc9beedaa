// ddp::cudaDeviceCount, gpuReport, cudaMaxMemoryAllocated, setCudaSyncDebugMode (include/ddp/cuda.h):
// LibTorch's CUDA half through the plugin (comm/cuda_plugin.h).
#include "ddp/cuda.h"

#include "comm/cuda_plugin.h"
#include "common/error.h"
#include "libddp/runtime/device.h"

namespace ddp {
namespace {

int indexOf(c10::Device device, const char* what) {
  if (!device.has_index()) DDP_THROW(ConfigError, what, ": give the GPU's index (cuda:N), not '", device.str(), "'");
  return device.index();
}

}  // namespace

int cudaDeviceCount() { return runtime::visibleCudaDevices("cuda"); }

std::optional<GpuReport> gpuReport(c10::Device device) {
  if (!device.is_cuda() || !comm::cudaPluginBuilt()) return std::nullopt;
  const int index = indexOf(device, "ddp::gpuReport");
  comm::GpuReport raw;
  comm::loadCudaPlugin().report(index, &raw);
  GpuReport out;
  out.name = raw.name;
  out.pciBusId = raw.pciBusId;
  out.totalBytes = raw.totalBytes;
  out.peakAllocatedBytes = raw.peakAllocatedBytes;
  out.peakReservedBytes = raw.peakReservedBytes;
  return out;
}

int64_t cudaMaxMemoryAllocated(c10::Device device) {
  if (!device.is_cuda() || !comm::cudaPluginBuilt()) return 0;
  return comm::loadCudaPlugin().peakAllocatedBytes(indexOf(device, "ddp::cudaMaxMemoryAllocated"));
}

void setCudaSyncDebugMode(CudaSyncDebugMode mode) {
  comm::loadCudaPlugin().setSyncDebugMode(static_cast<int>(mode));
}

}  // namespace ddp
