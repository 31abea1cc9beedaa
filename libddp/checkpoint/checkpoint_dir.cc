#include "libddp/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "common/error.h"
#include "libddp/checkpoint/training_checkpoint.h"

namespace ddp::checkpoint {
namespace fs = std::filesystem;

std::string checkpointPath(const std::string& dir, int64_t globalStep) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%08lld.pt", static_cast<long long>(globalStep));
  return (fs::path(dir) / name).string();
}

std::vector<std::string> listCheckpoints(const std::string& dir) {
  static const std::regex kName(R"(ckpt-(\d+)\.pt)");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, kName)) {
      found.emplace_back(std::stoll(m[1]), entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::optional<std::string> latestValidCheckpoint(
    const std::string& dir, const std::function<void(const std::string&, const std::string&)>& onSkip) {
  const auto all = listCheckpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      loadTrainingCheckpoint(*it);
      return *it;
    } catch (const CheckpointError& e) {
      if (onSkip) onSkip(*it, e.what());
    }
  }
  return std::nullopt;
}

void pruneCheckpoints(const std::string& dir, int64_t keepLast) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // writeFileAtomic's temporaries: ".ckpt-….pt.tmp.<pid>".
    if (name.rfind(".ckpt-", 0) == 0 && name.find(".tmp.") != std::string::npos) fs::remove(entry.path(), ec);
  }
  if (keepLast <= 0) return;
  const auto all = listCheckpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keepLast) < all.size(); ++i) fs::remove(all[i], ec);
}

}  // namespace ddp::checkpoint
