#include "ddp/straggler.h"

#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "common/flight_recorder.h"

namespace ddp {
namespace {

// The q-quantile (nearest rank) of `values`, sorted here.
double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t at = std::min(values.size() - 1, static_cast<size_t>(q * static_cast<double>(values.size())));
  return values[at];
}

}  // namespace

StragglerMonitor::StragglerMonitor(ProcessGroup group, std::string label)
    : group_(std::move(group)), label_(std::move(label)) {}

StragglerReport StragglerMonitor::measure() {
  StragglerReport report;
  // This rank's finished collectives with the label since the last look (the ring keeps the last
  // 256 entries: over a long interval, the latest ones).
  flight::Header* header = flight::Recorder::instance().header();
  std::vector<double> waits;
  if (header != nullptr && header->capacity > 0) {
    const flight::Snapshot ring = flight::readRing(header, flight::ringBytes(header->capacity));
    const uint64_t first = ring.writes > ring.records.size() ? ring.writes - ring.records.size() : 0;
    std::vector<const flight::Record*> fresh;
    for (size_t i = 0; i < ring.records.size(); ++i) {
      const flight::Record& r = ring.records[i];
      if (first + i >= seenWrites_ && r.state == flight::State::kDone && r.label == label_) fresh.push_back(&r);
    }
    seenWrites_ = ring.writes;
    // One step's collectives (DDP's buckets) are all awaited together at the end of its backward;
    // the next step's start after that. Of each step, the last one started tells the rank's wait:
    // started when its backward ended, it finishes once the last rank's has, so its time is the
    // wait for the others plus the transfer (a bucket started earlier also holds the rank's own
    // remaining backward).
    const flight::Record* last = nullptr;
    int64_t stepEnd = 0;
    for (const flight::Record* r : fresh) {
      if (last != nullptr && r->startNs > stepEnd) {
        waits.push_back(static_cast<double>(last->endNs - last->startNs) / 1e9);
        last = nullptr;
      }
      if (last == nullptr || r->startNs >= last->startNs) last = r;
      stepEnd = std::max(stepEnd, r->endNs);
    }
    if (last != nullptr) waits.push_back(static_cast<double>(last->endNs - last->startNs) / 1e9);
  }
  report.samples = static_cast<int>(waits.size());
  const int world = group_.size();
  if (world <= 1) return report;
  c10::NoGradGuard noGrad;
  // [median, p95, samples] of every rank, on the group's device.
  at::Tensor mine = at::tensor({quantile(waits, 0.5), quantile(waits, 0.95), static_cast<double>(waits.size())},
                               at::TensorOptions().dtype(at::kDouble).device(group_.device()));
  CollectiveOptions options;
  options.label = "StragglerMonitor";
  const std::vector<at::Tensor> all = group_.allGather(mine, options);
  report.medianWaitS.resize(static_cast<size_t>(world));
  report.p95WaitS.resize(static_cast<size_t>(world));
  bool everyRankMeasured = true;
  for (int r = 0; r < world; ++r) {
    const at::Tensor theirs = all[static_cast<size_t>(r)].cpu();
    report.medianWaitS[static_cast<size_t>(r)] = theirs[0].item<double>();
    report.p95WaitS[static_cast<size_t>(r)] = theirs[1].item<double>();
    everyRankMeasured = everyRankMeasured && theirs[2].item<double>() > 0;
  }
  if (!everyRankMeasured) return report;
  const auto least = std::min_element(report.medianWaitS.begin(), report.medianWaitS.end());
  report.straggler = static_cast<int>(least - report.medianWaitS.begin());
  std::vector<double> others;
  for (int r = 0; r < world; ++r) {
    if (r != report.straggler) others.push_back(report.medianWaitS[static_cast<size_t>(r)]);
  }
  report.skewS = quantile(others, 0.5) - *least;
  return report;
}

}  // namespace ddp
