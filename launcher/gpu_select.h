// Which GPUs a job gets: `--gpus auto[:N]` (most free memory first, busy ones skipped) or
// `--gpus 2,3`, decided by a pure function over a device table (NVML fills it: launcher/nvml.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

/// One physical GPU as nvidia-smi shows it: `index` is its nvidia-smi number (PCI bus order).
struct GpuInfo {
  int index = 0;
  std::string name;
  std::string uuid;       // "GPU-8c2f..."
  std::string pciBusId;   // "00000000:18:00.0"
  uint64_t totalMiB = 0;
  uint64_t usedMiB = 0;
  uint64_t freeMiB = 0;
  int utilizationPercent = -1;  // -1: NVML could not say
};

/// What --gpus, --gpu_max_used_mb and --gpu_max_util ask for.
struct GpuRequest {
  enum class Kind { kAuto, kList } kind = Kind::kAuto;
  int count = 0;                  // auto:N; 0 = every suitable GPU
  std::vector<int> indices;       // --gpus 2,3 (nvidia-smi numbers)
  uint64_t maxUsedMiB = 1024;     // auto skips a GPU with more memory in use than this
  int maxUtilizationPercent = 30; // ... or busier than this
};

/// Parses the value of --gpus ("auto", "auto:2", "2,3"); throws ConfigError on anything else.
GpuRequest parseGpuSpec(const std::string& spec);

/// The decision, for the workers' environment and the table the launcher prints.
struct GpuChoice {
  std::vector<int> chosen;             // nvidia-smi indices, rank order (local rank r gets chosen[r])
  std::vector<std::string> mig;        // CUDA_VISIBLE_DEVICES of MIG instances, passed on unchanged
  std::vector<std::string> verdict;    // per table row: "local rank 0" or why it was not chosen
  std::string cudaVisibleDevices;      // what every worker gets ("3,1"; MIG ids as given)
  int count() const { return static_cast<int>(mig.empty() ? chosen.size() : mig.size()); }
};

/// Chooses from `table` (any order; rows are shown sorted by index). `userVisible` is the
/// launcher's CUDA_VISIBLE_DEVICES when set: only the GPUs it names (indices in PCI order, GPU
/// UUIDs or unique UUID prefixes) are candidates, in its order for a list; MIG ids are passed on
/// unchanged (NVML's table does not describe them). Auto: suitable = used <= maxUsedMiB and
/// utilisation <= max (unknown counts as idle), most free memory first, ties by index. A list
/// takes exactly those GPUs, busy or not. Throws ConfigError (one line naming each GPU that was
/// passed over and why) when fewer than requested are suitable, an index does not exist, or the
/// list and CUDA_VISIBLE_DEVICES disagree.
GpuChoice chooseGpus(const std::vector<GpuInfo>& table, const GpuRequest& request,
                     const std::optional<std::string>& userVisible);

/// The table the launcher prints before starting anything (one line per GPU).
std::string formatGpuTable(const std::vector<GpuInfo>& table, const GpuChoice& choice);

}  // namespace ddp::launcher
