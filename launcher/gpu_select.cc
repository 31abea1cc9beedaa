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
  std::vector<GpuInfo> table = unsorted;
  std::sort(table.begin(), table.end(), [](const GpuInfo& a, const GpuInfo& b) { return a.index < b.index; });
  std::map<int, const GpuInfo*> byIndex;
  for (const auto& g : table) byIndex[g.index] = &g;
  GpuChoice choice;
  choice.verdict.assign(table.size(), "");
  auto verdictOf = [&](int index) -> std::string& {
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].index == index) return choice.verdict[i];
    }
    return choice.verdict.front();  // unreachable: callers pass indices from the table
  };

  // The candidates: every GPU, or those CUDA_VISIBLE_DEVICES names (in its order).
  std::vector<int> candidates;
  const bool restricted = userVisible.has_value() && !userVisible->empty();
  if (restricted) {
    for (const auto& entry : split(*userVisible, ',')) {
      if (entry.rfind("MIG-", 0) == 0) {
        choice.mig.push_back(entry);
        continue;
      }
      int found = -1;
      if (allDigits(entry)) {
        if (byIndex.count(std::stoi(entry)) != 0) found = std::stoi(entry);
      } else if (entry.rfind("GPU-", 0) == 0) {
        for (const auto& g : table) {
          if (g.uuid.rfind(entry, 0) == 0) {
            if (found >= 0) DDP_THROW(ConfigError, "CUDA_VISIBLE_DEVICES entry ", entry, " matches more than one GPU; give more of the UUID");
            found = g.index;
          }
        }
      }
      if (found < 0) {
        DDP_THROW(ConfigError, "CUDA_VISIBLE_DEVICES=", *userVisible, " names '", entry,
                  "', which is not a GPU of this host (", table.size(),
                  " GPUs: numbers 0..", static_cast<int>(table.size()) - 1,
                  " in nvidia-smi order, or GPU-<uuid>); fix or unset it");
      }
      if (std::find(candidates.begin(), candidates.end(), found) == candidates.end()) candidates.push_back(found);
    }
    if (!choice.mig.empty() && !candidates.empty()) {
      DDP_THROW(ConfigError, "CUDA_VISIBLE_DEVICES=", *userVisible, " mixes MIG instances and whole GPUs; CUDA "
                "uses only one kind: list either");
    }
    for (const auto& g : table) {
      if (std::find(candidates.begin(), candidates.end(), g.index) == candidates.end()) {
        verdictOf(g.index) = "not in CUDA_VISIBLE_DEVICES";
      }
    }
  } else {
    for (const auto& g : table) candidates.push_back(g.index);
  }

  if (!choice.mig.empty()) {
    // MIG instances are opaque to NVML's GPU table: take them as given, in their order.
    if (request.kind == GpuRequest::Kind::kList) {
      DDP_THROW(ConfigError, "--gpus ", joinInts(request.indices), " names whole GPUs but CUDA_VISIBLE_DEVICES lists MIG "
                "instances; use --gpus auto[:N] to take the first N of them");
    }
    if (request.count > 0) {
      if (request.count > static_cast<int>(choice.mig.size())) {
        DDP_THROW(ConfigError, "--gpus auto:", request.count, " but CUDA_VISIBLE_DEVICES lists ", choice.mig.size(),
                  " MIG instance(s); lower N or list more");
      }
      choice.mig.resize(static_cast<size_t>(request.count));
    }
    for (const auto& m : choice.mig) choice.cudaVisibleDevices += (choice.cudaVisibleDevices.empty() ? "" : ",") + m;
    return choice;
  }

  if (request.kind == GpuRequest::Kind::kList) {
    for (int index : request.indices) {
      if (byIndex.count(index) == 0) {
        DDP_THROW(ConfigError, "--gpus ", joinInts(request.indices), ": GPU ", index, " does not exist (this host has ",
                  table.size(), " GPU(s), numbered 0..", static_cast<int>(table.size()) - 1, " as nvidia-smi shows)");
      }
      if (std::find(candidates.begin(), candidates.end(), index) == candidates.end()) {
        DDP_THROW(ConfigError, "--gpus ", joinInts(request.indices), " takes GPU ", index, " but CUDA_VISIBLE_DEVICES=",
                  *userVisible, " hides it; give one of the two");
      }
      choice.chosen.push_back(index);
    }
  } else {
    std::vector<const GpuInfo*> suitable;
    std::string passedOver;
    for (int index : candidates) {
      const GpuInfo& g = *byIndex.at(index);
      const std::string why = busyReason(g, request);
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
    const size_t wanted = request.count > 0 ? static_cast<size_t>(request.count) : std::max<size_t>(suitable.size(), 1);
    if (suitable.size() < wanted) {
      DDP_THROW(ConfigError, "--gpus auto", request.count > 0 ? ":" + std::to_string(request.count) : std::string(),
                " found ", suitable.size(), " suitable GPU(s) of ", candidates.size(),
                candidates.size() == 0 ? std::string(" (no GPU)") : std::string(),
                passedOver.empty() ? std::string() : ": " + passedOver,
                "; ask for fewer, free the GPUs, or raise --gpu_max_used_mb / --gpu_max_util");
    }
    for (size_t i = 0; i < wanted; ++i) choice.chosen.push_back(suitable[i]->index);
    for (size_t i = wanted; i < suitable.size(); ++i) verdictOf(suitable[i]->index) = "not needed (auto:" + std::to_string(request.count) + ")";
  }
  for (size_t r = 0; r < choice.chosen.size(); ++r) {
    std::string& v = verdictOf(choice.chosen[r]);
    const std::string busy = request.kind == GpuRequest::Kind::kList ? busyReason(*byIndex.at(choice.chosen[r]), request) : "";
    v = "local rank " + std::to_string(r) + (busy.empty() ? "" : " (busy: " + busy + ")");
  }
  choice.cudaVisibleDevices = joinInts(choice.chosen);
  return choice;
}

std::string formatGpuTable(const std::vector<GpuInfo>& unsorted, const GpuChoice& choice) {
  std::vector<GpuInfo> table = unsorted;
  std::sort(table.begin(), table.end(), [](const GpuInfo& a, const GpuInfo& b) { return a.index < b.index; });
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
