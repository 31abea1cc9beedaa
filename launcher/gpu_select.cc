#include "launcher/gpu_select.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "common/error.h"

namespace ddp::launcher {
namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : item.substr(b, e - b + 1));
  }
  return out;
}

bool allDigits(const std::string& s) {
  return !s.empty() && s.size() <= 6 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string joinInts(const std::vector<int>& v) {
  std::string out;
  for (int i : v) out += (out.empty() ? "" : ",") + std::to_string(i);
  return out;
}

// Why auto passes over a GPU, or "" when it is suitable.
std::string busyReason(const GpuInfo& g, const GpuRequest& r) {
  if (g.usedMiB > r.maxUsedMiB) {
    return "memory in use " + std::to_string(g.usedMiB) + " MiB > --gpu_max_used_mb=" + std::to_string(r.maxUsedMiB);
  }
  if (g.utilizationPercent > r.maxUtilizationPercent) {
    return "utilisation " + std::to_string(g.utilizationPercent) + "% > --gpu_max_util=" +
           std::to_string(r.maxUtilizationPercent);
  }
  return "";
}

std::vector<GpuInfo> sortedByIndex(const std::vector<GpuInfo>& unsorted) {
  std::vector<GpuInfo> table = unsorted;
  std::sort(table.begin(), table.end(), [](const GpuInfo& a, const GpuInfo& b) { return a.index < b.index; });
  return table;
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// One chooseGpus() decision: the candidates CUDA_VISIBLE_DEVICES leaves, then MIG instances as
// given, a --gpus list as asked, or auto's pick; each table row gets its verdict on the way.
class GpuChooser {
 public:
  GpuChooser(const std::vector<GpuInfo>& unsorted, const GpuRequest& request,
             const std::optional<std::string>& userVisible)
      : table_(sortedByIndex(unsorted)), request_(request), userVisible_(userVisible) {
    for (const auto& g : table_) byIndex_[g.index] = &g;
    choice_.verdict.assign(table_.size(), "");
  }
  GpuChooser(const GpuChooser&) = delete;  // byIndex_ points into table_
  GpuChooser& operator=(const GpuChooser&) = delete;

  GpuChoice choose() {
    const std::vector<int> candidates = findCandidates();
    if (!choice_.mig.empty()) return chooseMig();
    if (request_.kind == GpuRequest::Kind::kList) {
      chooseListed(candidates);
    } else {
      chooseAuto(candidates);
    }
    labelChosen();
    choice_.cudaVisibleDevices = joinInts(choice_.chosen);
    return choice_;
  }

 private:
  std::string& verdictOf(int index) {
    for (size_t i = 0; i < table_.size(); ++i) {
      if (table_[i].index == index) return choice_.verdict[i];
    }
    return choice_.verdict.front();  // unreachable: callers pass indices from the table
  }

  // The candidates: every GPU, or those CUDA_VISIBLE_DEVICES names (in its order); its MIG
  // instances go to choice_.mig.
  std::vector<int> findCandidates() {
    std::vector<int> candidates;
    if (!userVisible_.has_value() || userVisible_->empty()) {
      for (const auto& g : table_) candidates.push_back(g.index);
      return candidates;
    }
    for (const auto& entry : split(*userVisible_, ',')) {
      if (entry.rfind("MIG-", 0) == 0) {
        choice_.mig.push_back(entry);
        continue;
      }
      const int found = visibleGpu(entry);
      if (!contains(candidates, found)) candidates.push_back(found);
    }
    if (!choice_.mig.empty() && !candidates.empty()) {
      DDP_THROW(ConfigError, "CUDA_VISIBLE_DEVICES=", *userVisible_, " mixes MIG instances and whole GPUs; CUDA "
                "uses only one kind: list either");
    }
    for (const auto& g : table_) {
      if (!contains(candidates, g.index)) verdictOf(g.index) = "not in CUDA_VISIBLE_DEVICES";
    }
    return candidates;
  }

  // The GPU one CUDA_VISIBLE_DEVICES entry names: an index, or a GPU UUID or unique prefix of one.
  int visibleGpu(const std::string& entry) const {
    int found = -1;
    if (allDigits(entry)) {
      if (byIndex_.count(std::stoi(entry)) != 0) found = std::stoi(entry);
    } else if (entry.rfind("GPU-", 0) == 0) {
      for (const auto& g : table_) {
        if (g.uuid.rfind(entry, 0) == 0) {
          if (found >= 0) {
            DDP_THROW(ConfigError, "CUDA_VISIBLE_DEVICES entry ", entry,
                      " matches more than one GPU; give more of the UUID");
          }
          found = g.index;
        }
      }
    }
    if (found < 0) {
      DDP_THROW(ConfigError, "CUDA_VISIBLE_DEVICES=", *userVisible_, " names '", entry,
                "', which is not a GPU of this host (", table_.size(),
                " GPUs: numbers 0..", static_cast<int>(table_.size()) - 1,
                " in nvidia-smi order, or GPU-<uuid>); fix or unset it");
    }
    return found;
  }

  // MIG instances are opaque to NVML's GPU table: take them as given, in their order.
  GpuChoice chooseMig() {
    if (request_.kind == GpuRequest::Kind::kList) {
      DDP_THROW(ConfigError, "--gpus ", joinInts(request_.indices),
                " names whole GPUs but CUDA_VISIBLE_DEVICES lists MIG instances; use --gpus auto[:N] to take the first "
                "N of them");
    }
    if (request_.count > 0) {
      if (request_.count > static_cast<int>(choice_.mig.size())) {
        DDP_THROW(ConfigError, "--gpus auto:", request_.count, " but CUDA_VISIBLE_DEVICES lists ", choice_.mig.size(),
                  " MIG instance(s); lower N or list more");
      }
      choice_.mig.resize(static_cast<size_t>(request_.count));
    }
    for (const auto& m : choice_.mig) choice_.cudaVisibleDevices += (choice_.cudaVisibleDevices.empty() ? "" : ",") + m;
    return choice_;
  }

  // --gpus 2,3: exactly those, busy or not.
  void chooseListed(const std::vector<int>& candidates) {
    for (int index : request_.indices) {
      if (byIndex_.count(index) == 0) {
        DDP_THROW(ConfigError, "--gpus ", joinInts(request_.indices), ": GPU ", index,
                  " does not exist (this host has ", table_.size(), " GPU(s), numbered 0..",
                  static_cast<int>(table_.size()) - 1, " as nvidia-smi shows)");
      }
      if (!contains(candidates, index)) {
        DDP_THROW(ConfigError, "--gpus ", joinInts(request_.indices), " takes GPU ", index,
                  " but CUDA_VISIBLE_DEVICES=", *userVisible_, " hides it; give one of the two");
      }
      choice_.chosen.push_back(index);
    }
  }

  // --gpus auto[:N]: the suitable candidates with most free memory first, ties by index.
  void chooseAuto(const std::vector<int>& candidates) {
    std::vector<const GpuInfo*> suitable;
    std::string passedOver;
    for (int index : candidates) {
      const GpuInfo& g = *byIndex_.at(index);
      const std::string why = busyReason(g, request_);
      if (why.empty()) {
        suitable.push_back(&g);
      } else {
        verdictOf(index) = "skipped: " + why;
        passedOver += (passedOver.empty() ? "" : ", ") + ("GPU " + std::to_string(index) + " (" + why + ")");
      }
    }
    std::stable_sort(suitable.begin(), suitable.end(), [](const GpuInfo* a, const GpuInfo* b) {
      return a->freeMiB != b->freeMiB ? a->freeMiB > b->freeMiB : a->index < b->index;
    });
    const size_t wanted =
        request_.count > 0 ? static_cast<size_t>(request_.count) : std::max<size_t>(suitable.size(), 1);
    if (suitable.size() < wanted) {
      DDP_THROW(ConfigError, "--gpus auto", request_.count > 0 ? ":" + std::to_string(request_.count) : std::string(),
                " found ", suitable.size(), " suitable GPU(s) of ", candidates.size(),
                candidates.size() == 0 ? std::string(" (no GPU)") : std::string(),
                passedOver.empty() ? std::string() : ": " + passedOver,
                "; ask for fewer, free the GPUs, or raise --gpu_max_used_mb / --gpu_max_util");
    }
    for (size_t i = 0; i < wanted; ++i) choice_.chosen.push_back(suitable[i]->index);
    for (size_t i = wanted; i < suitable.size(); ++i) {
      verdictOf(suitable[i]->index) = "not needed (auto:" + std::to_string(request_.count) + ")";
    }
  }

  // The chosen rows' verdicts: their local rank, and for a list, whether the GPU is busy.
  void labelChosen() {
    for (size_t r = 0; r < choice_.chosen.size(); ++r) {
      std::string& v = verdictOf(choice_.chosen[r]);
      const std::string busy =
          request_.kind == GpuRequest::Kind::kList ? busyReason(*byIndex_.at(choice_.chosen[r]), request_) : "";
      v = "local rank " + std::to_string(r) + (busy.empty() ? "" : " (busy: " + busy + ")");
    }
  }

  const std::vector<GpuInfo> table_;          // by index, as the printed table shows it
  std::map<int, const GpuInfo*> byIndex_;      // into table_
  const GpuRequest& request_;
  const std::optional<std::string>& userVisible_;
  GpuChoice choice_;
};

}  // namespace

GpuRequest parseGpuSpec(const std::string& spec) {
  GpuRequest r;
  const std::string hint = "; use --gpus auto (every idle GPU), --gpus auto:N (the N with most free memory) or "
                           "--gpus 0,2 (those nvidia-smi numbers)";
  if (spec == "auto") return r;
  if (spec.rfind("auto:", 0) == 0) {
    const std::string n = spec.substr(5);
    if (!allDigits(n) || std::stoi(n) < 1) DDP_THROW(ConfigError, "--gpus ", spec, ": N must be a number >= 1", hint);
    r.count = std::stoi(n);
    return r;
  }
  r.kind = GpuRequest::Kind::kList;
  for (const auto& item : split(spec, ',')) {
    if (!allDigits(item)) DDP_THROW(ConfigError, "--gpus ", spec, ": '", item, "' is not a GPU number", hint);
    const int index = std::stoi(item);
    if (std::find(r.indices.begin(), r.indices.end(), index) != r.indices.end()) {
      DDP_THROW(ConfigError, "--gpus ", spec, " names GPU ", index, " twice; give each GPU once");
    }
    r.indices.push_back(index);
  }
  if (r.indices.empty()) DDP_THROW(ConfigError, "--gpus is empty", hint);
  return r;
}

GpuChoice chooseGpus(const std::vector<GpuInfo>& unsorted, const GpuRequest& request,
                     const std::optional<std::string>& userVisible) {
  return GpuChooser(unsorted, request, userVisible).choose();
}

std::string formatGpuTable(const std::vector<GpuInfo>& unsorted, const GpuChoice& choice) {
  const std::vector<GpuInfo> table = sortedByIndex(unsorted);
  std::string out = "GPU  name                      PCI bus id         free / total MiB  util  choice\n";
  char line[512];
  for (size_t i = 0; i < table.size(); ++i) {
    const GpuInfo& g = table[i];
    const std::string util = g.utilizationPercent < 0 ? "?" : std::to_string(g.utilizationPercent) + "%";
    std::snprintf(line, sizeof line, "%3d  %-24.24s  %-16s  %7llu / %-7llu  %4s  %s\n", g.index, g.name.c_str(),
                  g.pciBusId.c_str(), static_cast<unsigned long long>(g.freeMiB),
                  static_cast<unsigned long long>(g.totalMiB), util.c_str(),
                  i < choice.verdict.size() ? choice.verdict[i].c_str() : "");
    out += line;
  }
  for (size_t r = 0; r < choice.mig.size(); ++r) {
    out += "MIG  " + choice.mig[r] + "  local rank " + std::to_string(r) + " (MIG instance, not inspected)\n";
  }
  return out;
}

}  // namespace ddp::launcher
