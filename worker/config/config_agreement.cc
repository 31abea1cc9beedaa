#include "worker/config/config_agreement.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace ddp::worker {
namespace {

// FNV-1a, 64 bit: stable across processes and builds (std::hash is not promised to be).
int64_t hashOf(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return static_cast<int64_t>(hash);
}

}  // namespace

bool mayDifferAcrossRanks(const std::string& key) { return key == "data.root" || key == "threads"; }

void checkConfigAgreement(const WorkerConfig& config, ProcessGroup& group) {
  if (group.size() == 1) return;
  std::vector<std::pair<std::string, std::string>> values;
  for (auto& [key, value] : configValues(config)) {
    if (!mayDifferAcrossRanks(key)) values.emplace_back(key, value);
  }
  const auto n = static_cast<int64_t>(values.size());
  at::Tensor mine = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) mine[i] = hashOf(values[static_cast<size_t>(i)].second);
  at::Tensor rank0 = mine.clone().to(group.collectiveDevice());
  group.broadcast(rank0, /*root=*/0);
  at::Tensor differs = mine.ne(rank0.cpu()).to(at::kDouble).to(group.collectiveDevice());
  group.allReduce(differs);
  differs = differs.cpu();
  rank0 = rank0.cpu();

  std::string keys;
  bool fromRank0 = false;  // this rank is one of those that differ from rank 0
  for (int64_t i = 0; i < n; ++i) {
    if (differs[i].item<double>() == 0) continue;
    const auto& [key, value] = values[static_cast<size_t>(i)];
    keys += (keys.empty() ? "" : ", ") + key + "=" + value;
    fromRank0 = fromRank0 || mine[i].item<int64_t>() != rank0[i].item<int64_t>();
  }
  if (keys.empty()) return;
  DDP_THROW(ConfigError, "config: ",
            fromRank0 ? "rank " + std::to_string(group.rank()) + " resolved another config than rank 0"
                      : "another rank resolved another config than this one (rank " + std::to_string(group.rank()) + ")",
            ": ", keys, " here; start every rank with the same config file and overrides");
}

}  // namespace ddp::worker
