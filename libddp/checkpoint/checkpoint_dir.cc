#include "libddp/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/error.h"
#include "libddp/checkpoint/training_checkpoint.h"

namespace ddp::checkpoint {
namespace fs = std::filesystem;

nlohmann::json readManifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kShardedManifest).string();
  std::ifstream in(path);
  if (!in) {
    DDP_THROW(CheckpointError, "'", dir, "' is not a complete sharded checkpoint (no ", kShardedManifest,
              ": its write was interrupted)");
  }
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DDP_THROW(CheckpointError, "'", path, "' is damaged (", e.what(), ")");
  }
  if (!manifest.is_object() || manifest.value("format", "") != kShardedCheckpointFormat ||
      !manifest.contains("files") || !manifest["files"].is_array() || !manifest.contains("tensors")) {
    DDP_THROW(CheckpointError, "'", path, "' is not a ", kShardedCheckpointFormat, " manifest");
  }
  return manifest;
}

std::string shardedCheckpointPath(const std::string& dir, int64_t globalStep) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%08lld", static_cast<long long>(globalStep));
  return (fs::path(dir) / name).string();
}

bool isShardedCheckpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

void verifyShardedCheckpoint(const std::string& path) {
  const nlohmann::json manifest = readManifest(path);
  for (const auto& f : manifest["files"]) {
    const std::string file = (fs::path(path) / f.value("name", "")).string();
    std::error_code ec;
    const auto bytes = fs::file_size(file, ec);
    if (ec) DDP_THROW(CheckpointError, "'", path, "' misses '", file, "' (", ec.message(), ")");
    if (bytes != f.value("bytes", uintmax_t{0})) {
      DDP_THROW(CheckpointError, "'", file, "' has ", bytes, " bytes, its manifest says ", f.value("bytes", uintmax_t{0}),
                " (truncated or replaced)");
    }
  }
}

std::string checkpointPath(const std::string& dir, int64_t globalStep) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%08lld.pt", static_cast<long long>(globalStep));
  return (fs::path(dir) / name).string();
}

std::vector<std::string> listCheckpoints(const std::string& dir) {
  // Files "ckpt-00000120.pt", and sharded checkpoints' directories "ckpt-00000120/" once their
  // manifest is written (the last thing written).
  static const std::regex kName(R"(ckpt-(\d+)\.pt)"), kDirName(R"(ckpt-(\d+))");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, kName)) {
      found.emplace_back(std::stoll(m[1]), entry.path().string());
    } else if (entry.is_directory() && std::regex_match(name, m, kDirName) &&
               fs::exists(entry.path() / kShardedManifest, ec)) {
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
      // A sharded checkpoint's files are read by the ranks that need them, each verified then.
      if (isShardedCheckpoint(*it)) {
        verifyShardedCheckpoint(*it);
      } else {
        loadTrainingCheckpoint(*it);
      }
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
    // writeFileAtomic's temporaries: ".ckpt-….pt.tmp.<pid>"; interrupted sharded writes: ".ckpt-….tmp/".
    if (name.rfind(".ckpt-", 0) == 0 && name.find(".tmp") != std::string::npos) fs::remove_all(entry.path(), ec);
  }
  if (keepLast <= 0) return;
  const auto all = listCheckpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keepLast) < all.size(); ++i) fs::remove_all(all[i], ec);
}

}  // namespace ddp::checkpoint
