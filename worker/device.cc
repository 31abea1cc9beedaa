#include "worker/device.h"

#include <torch/cuda.h>

#include <cstdlib>

#include "common/error.h"

namespace ddp::worker {

c10::Device selectDevice(const std::string& requested, int localRank) {
  if (requested == "cpu") return c10::Device(c10::kCPU);
  const bool haveCuda = torch::cuda::is_available();
  if (requested == "auto" && !haveCuda) return c10::Device(c10::kCPU);
  if (!haveCuda) {
    DDP_THROW(ConfigError, "config: device '", requested, "' but no GPU is visible to this process (or "
              "LibTorch was built without CUDA); use device: cpu or auto");
  }
  // cuda:N names a visible GPU explicitly; auto and cuda take the rank's own.
  const int index = requested.rfind("cuda:", 0) == 0 ? std::stoi(requested.substr(5)) : localRank;
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (index >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    DDP_THROW(ConfigError, requested.rfind("cuda:", 0) == 0 ? "device " + requested : "LOCAL_RANK " + std::to_string(localRank),
              " needs GPU ", index, " but only ", count, " GPU(s) are visible (CUDA_VISIBLE_DEVICES=",
              visible ? visible : "<unset>", "); GPU numbers are logical, counted after CUDA_VISIBLE_DEVICES; "
              "start at most ", count, " workers per node with --nproc_per_node");
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace ddp::worker
