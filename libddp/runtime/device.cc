#include "libddp/runtime/device.h"

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <cstdlib>

#include "comm/cuda_plugin.h"
#include "common/error.h"

namespace ddp::runtime {

c10::Device planDevice(const DeviceRequest& r) {
  if (r.requested == "cpu") return c10::Device(c10::kCPU);
  if (r.requested == "auto" && r.visibleGpus == 0) return c10::Device(c10::kCPU);
  if (r.visibleGpus == 0) {
    DDP_THROW(ConfigError, "config: device '", r.requested, "' but no GPU is visible to this process (or "
              "LibTorch was built without CUDA); use device: cpu or auto");
  }
  // cuda:N names a visible GPU explicitly; auto and cuda take the rank's own.
  const bool fixed = r.requested.rfind("cuda:", 0) == 0;
  const int index = fixed ? std::stoi(r.requested.substr(5)) : r.localRank;
  if (fixed && r.localWorldSize > 1 && !r.ranksMayShareGpu) {
    DDP_THROW(ConfigError, "config: device ", r.requested, " puts all ", r.localWorldSize,
              " ranks of this host on one GPU, which NCCL refuses (Duplicate GPU detected); use "
              "device: cuda (rank r takes cuda:LOCAL_RANK) and pick the GPUs with CUDA_VISIBLE_DEVICES, "
              "or backend: gloo to share one GPU");
  }
  if (index >= r.visibleGpus) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    DDP_THROW(ConfigError, fixed ? "device " + r.requested : "LOCAL_RANK " + std::to_string(r.localRank),
              " needs GPU ", index, " but only ", r.visibleGpus, " GPU(s) are visible (CUDA_VISIBLE_DEVICES=",
              visible ? visible : "<unset>", "); GPU numbers are logical, counted after CUDA_VISIBLE_DEVICES; "
              "start at most ", r.visibleGpus, " workers per node with --nproc_per_node");
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

int visibleCudaDevices(const std::string& requested) {
  if (requested == "cpu") return 0;
  if (comm::cudaPluginBuilt()) {
    // Ask the driver first: a CPU-only host never loads LibTorch's CUDA half (comm/cuda_plugin.h).
    if (comm::driverGpuCount() == 0) return 0;
    comm::loadCudaPlugin();
  }
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

c10::Device selectDevice(DeviceRequest request) {
  request.visibleGpus = visibleCudaDevices(request.requested);
  return planDevice(request);
}

void useDevice(c10::Device device) {
  if (!device.is_cuda()) return;
  c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
}

}  // namespace ddp::runtime
