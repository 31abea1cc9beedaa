// Which device a rank computes on: cuda:LOCAL_RANK when GPUs are visible, else CPU.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace ddp::runtime {

/// What the device choice depends on; planDevice() is a pure function of it.
struct DeviceRequest {
  std::string requested = "auto";  // config device: auto | cpu | cuda | cuda:N
  int localRank = 0;               // indexes the *visible* GPUs (after CUDA_VISIBLE_DEVICES)
  int localWorldSize = 1;          // ranks on this host that compute (1 for single/eval)
  int visibleGpus = 0;             // torch::cuda::device_count(), 0 without CUDA
  bool ranksMayShareGpu = false;   // backend gloo: several ranks on one GPU work (NCCL refuses)
};

/// The rank's device, or a ConfigError saying what to change: no GPU for
/// cuda, a LOCAL_RANK or cuda:N past the visible GPUs, or cuda:N for several
/// ranks of a host with NCCL ("Duplicate GPU detected").
c10::Device planDevice(const DeviceRequest& request);

/// GPUs this process can compute on for config device `requested` (0 for cpu). On a CUDA build it
/// asks the driver first and loads LibTorch's CUDA half (comm/cuda_plugin.h) only when there is a
/// GPU; so a CPU-only host or device: cpu never pays for it.
int visibleCudaDevices(const std::string& requested);

/// planDevice() with the GPUs this process sees.
c10::Device selectDevice(DeviceRequest request);

/// Makes a CUDA device the calling thread's current one (before NCCL or any
/// CUDA work, so that nothing opens a context on GPU 0); no-op for CPU.
void useDevice(c10::Device device);

}  // namespace ddp::runtime
