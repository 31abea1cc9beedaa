#include "launcher/gpu_launch.h"

#include <sched.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "common/error.h"
#include "launcher/gpu_select.h"
#include "launcher/nvml.h"

namespace ddp::launcher {
namespace {

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int countEntries(const std::string& list) {
  int n = list.empty() ? 0 : 1;
  for (char c : list) n += c == ',' ? 1 : 0;
  return n;
}

}  // namespace

std::string resolveGpus(LaunchOptions& options, const EnvMap& environment) {
  const auto visible = environment.find("CUDA_VISIBLE_DEVICES");
  const std::optional<std::string> userVisible =
      visible == environment.end() ? std::nullopt : std::optional<std::string>(visible->second);
  if (options.gpus.empty()) {
    if (!options.nprocAuto) return "";
    if (options.nprocWord == "cpu") {
      options.nprocPerNode = usableCpus();
      return "--nproc_per_node=cpu: " + std::to_string(options.nprocPerNode) + " (one worker per CPU this process may use)";
    }
    std::string why;
    const auto table = queryGpus(&why);
    const int gpus = !table ? 0 : userVisible ? countEntries(*userVisible) : static_cast<int>(table->size());
    if (gpus <= 0 && options.nprocWord == "gpu") {
      DDP_THROW(ConfigError, "--nproc_per_node=gpu but no GPU is visible (", table ? "none listed" : why,
                "); use --nproc_per_node=cpu or a number to train on CPU");
    }
    if (gpus > 0) {
      options.nprocPerNode = gpus;
      return "--nproc_per_node=" + options.nprocWord + ": " + std::to_string(gpus) + " (the GPUs " +
             (userVisible ? "CUDA_VISIBLE_DEVICES names" : "NVML shows") + ")";
    }
    options.nprocPerNode = usableCpus();
    return "--nproc_per_node=auto: " + std::to_string(options.nprocPerNode) +
           " (no GPU: one worker per CPU this process may use)";
  }

  std::string why;
  const auto table = queryGpus(&why);
  if (!table) {
    DDP_THROW(ConfigError, "--gpus ", options.gpus, " needs NVML (libnvidia-ml.so.1, part of the NVIDIA driver): ",
              why, "; drop --gpus to train on CPU");
  }
  GpuRequest request = parseGpuSpec(options.gpus);
  request.maxUsedMiB = static_cast<uint64_t>(options.gpuMaxUsedMb);
  request.maxUtilizationPercent = options.gpuMaxUtil;
  const GpuChoice choice = chooseGpus(*table, request, userVisible);
  if (options.nprocAuto || !options.nprocPerNodeGiven) {
    options.nprocPerNode = choice.count();
  } else if (options.nprocPerNode != choice.count()) {
    DDP_THROW(ConfigError, "--nproc_per_node=", options.nprocPerNode, " but --gpus ", options.gpus, " chose ",
              choice.count(), " GPU(s) (", choice.cudaVisibleDevices, "); use --nproc_per_node=auto (one worker per GPU chosen)");
  }
  options.cudaVisibleDevices = choice.cudaVisibleDevices;
  return "--gpus " + options.gpus + ": " + std::to_string(choice.count()) + " worker(s) on CUDA_VISIBLE_DEVICES=" +
         choice.cudaVisibleDevices + " (CUDA_DEVICE_ORDER=PCI_BUS_ID: numbers as in nvidia-smi)\n" +
         formatGpuTable(*table, choice);
}

}  // namespace ddp::launcher
