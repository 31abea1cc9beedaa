// The GPU table from NVML, the NVIDIA management library, loaded at run time (libnvidia-ml.so.1
// comes with the driver): ddp-launch still runs, and says so, where it is absent.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/gpu_select.h"

namespace ddp::launcher {

/// Every GPU of this host in nvidia-smi order (NVML's, PCI bus order), ignoring
/// CUDA_VISIBLE_DEVICES (chooseGpus() applies it). nullopt when NVML is not installed (no driver);
/// `why` then says what was missing. Throws ddp::Error when NVML is there but fails.
std::optional<std::vector<GpuInfo>> queryGpus(std::string* why = nullptr);

}  // namespace ddp::launcher
