#include "worker/report/rank_report.h"

#include <ATen/ops/zeros.h>

#include <cstdio>

#include "ddp/cuda.h"
#include "worker/report/memory_stats.h"

namespace ddp::worker {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
// Per rank: rss, own copy, has gpu, total, allocated, reserved, optimizer state, parameters,
// gradients, then the strings' bytes.
constexpr int64_t kNumbers = 9;
constexpr int64_t kDeviceBytes = 16;
constexpr int64_t kNameBytes = 128;
constexpr int64_t kBusBytes = 32;
constexpr int64_t kSlot = kNumbers + kDeviceBytes + kNameBytes + kBusBytes;

void putString(double* at, int64_t size, const std::string& s) {
  for (int64_t i = 0; i < size && i < static_cast<int64_t>(s.size()); ++i) {
    at[i] = static_cast<unsigned char>(s[static_cast<size_t>(i)]);
  }
}

std::string getString(const double* at, int64_t size) {
  std::string s;
  for (int64_t i = 0; i < size && at[i] != 0; ++i) s += static_cast<char>(static_cast<int>(at[i]));
  return s;
}

}  // namespace

RankReport measureRank(c10::Device device, bool ownDataCopy) {
  RankReport r;
  r.peakRssMb = static_cast<double>(dp::peakRssBytes()) / kMiB;
  r.ownDataCopy = ownDataCopy;
  r.device = device.str();
  if (const std::optional<GpuReport> g = gpuReport(device)) {
    r.gpu = GpuUse{g->name, g->pciBusId, static_cast<double>(g->totalBytes) / kMiB,
                   static_cast<double>(g->peakAllocatedBytes) / kMiB, static_cast<double>(g->peakReservedBytes) / kMiB};
  }
  return r;
}

std::vector<RankReport> gatherRankReports(ProcessGroup& group, const RankReport& mine) {
  const int size = group.size();
  at::Tensor all = at::zeros({size * kSlot}, at::kDouble);
  double* slot = all.data_ptr<double>() + group.rank() * kSlot;
  slot[0] = mine.peakRssMb;
  slot[1] = mine.ownDataCopy ? 1 : 0;
  slot[2] = mine.gpu ? 1 : 0;
  slot[6] = mine.optimizerStateMb;
  slot[7] = mine.parameterMb;
  slot[8] = mine.gradientMb;
  if (mine.gpu) {
    slot[3] = mine.gpu->totalMb;
    slot[4] = mine.gpu->peakAllocatedMb;
    slot[5] = mine.gpu->peakReservedMb;
    putString(slot + kNumbers + kDeviceBytes, kNameBytes, mine.gpu->name);
    putString(slot + kNumbers + kDeviceBytes + kNameBytes, kBusBytes, mine.gpu->pciBusId);
  }
  putString(slot + kNumbers, kDeviceBytes, mine.device);
  const c10::Device on = group.collectiveDevice();
  if (!on.is_cpu()) all = all.to(on);
  group.allReduce(all);
  all = all.cpu().contiguous();
  std::vector<RankReport> out;
  if (group.rank() != 0) return out;
  for (int r = 0; r < size; ++r) {
    const double* s = all.data_ptr<double>() + r * kSlot;
    RankReport report;
    report.peakRssMb = s[0];
    report.ownDataCopy = s[1] != 0;
    report.optimizerStateMb = s[6];
    report.parameterMb = s[7];
    report.gradientMb = s[8];
    report.device = getString(s + kNumbers, kDeviceBytes);
    if (s[2] != 0) {
      report.gpu = GpuUse{getString(s + kNumbers + kDeviceBytes, kNameBytes),
                          getString(s + kNumbers + kDeviceBytes + kNameBytes, kBusBytes), s[3], s[4], s[5]};
    }
    out.push_back(std::move(report));
  }
  return out;
}

nlohmann::json gpuSummary(const std::vector<RankReport>& reports) {
  nlohmann::json gpus = nlohmann::json::array();
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r].gpu) continue;
    const GpuUse& g = *reports[r].gpu;
    gpus.push_back({{"rank", r}, {"device", reports[r].device}, {"name", g.name}, {"pci_bus_id", g.pciBusId},
                    {"total_mb", g.totalMb}, {"peak_allocated_mb", g.peakAllocatedMb},
                    {"peak_reserved_mb", g.peakReservedMb}});
  }
  return gpus;
}

std::vector<std::string> gpuReportLines(const std::vector<RankReport>& reports) {
  std::vector<std::string> lines;
  char line[512];
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r].gpu) continue;
    const GpuUse& g = *reports[r].gpu;
    std::snprintf(line, sizeof line, "GPU report: rank %zu %s %s (%s, %.0f MiB): peak allocated %.1f MiB, reserved %.1f MiB",
                  r, reports[r].device.c_str(), g.name.c_str(), g.pciBusId.c_str(), g.totalMb, g.peakAllocatedMb,
                  g.peakReservedMb);
    lines.emplace_back(line);
  }
  return lines;
}

}  // namespace ddp::worker
