// What every rank reports to rank 0 at the end of a run: memory, where its data came from, its GPU.
#pragma once

#include <c10/core/Device.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp::worker {

struct GpuUse {
  std::string name;     // "NVIDIA H100 80GB HBM3"
  std::string pciBusId; // as nvidia-smi shows it
  double totalMb = 0;
  double peakAllocatedMb = 0;  // torch.cuda.max_memory_allocated
  double peakReservedMb = 0;   // torch.cuda.max_memory_reserved
};

struct RankReport {
  double peakRssMb = 0;
  double optimizerStateMb = 0;  // the optimizer state this rank holds (train.zero: its shard)
  double parameterMb = 0;       // the parameters this rank holds (train.sharding full: its shards)
  double gradientMb = 0;        // the gradients this rank holds (full: its sharded gradients)
  bool ownDataCopy = true;  // loaded the data itself (false: mapped its host's copy)
  std::string device;       // "cuda:0", "cpu"
  std::optional<GpuUse> gpu;
};

/// This process's report (peak RSS; the GPU's name, bus id and peaks for a CUDA device).
RankReport measureRank(c10::Device device, bool ownDataCopy);

/// Every rank's report, in rank order, at rank 0 (others get an empty vector). A collective: every
/// rank calls it. Strings travel as bytes in a tensor, so Gloo, NCCL and shm carry it alike.
std::vector<RankReport> gatherRankReports(ProcessGroup& group, const RankReport& mine);

/// summary.json's "gpus": one entry per rank on a GPU ({rank, device, name, pci_bus_id,
/// total_mb, peak_allocated_mb, peak_reserved_mb}); empty when no rank used one.
nlohmann::json gpuSummary(const std::vector<RankReport>& reports);

/// One log line per GPU rank ("rank 0 cuda:0 NVIDIA H100 (0000:18:00.0): peak allocated ...").
std::vector<std::string> gpuReportLines(const std::vector<RankReport>& reports);

}  // namespace ddp::worker
