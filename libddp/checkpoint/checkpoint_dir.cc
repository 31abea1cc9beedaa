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

namespace {

bool nonNegativeInteger(const nlohmann::json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

// What is wrong with a manifest's structure ("" when nothing): the files (plain names, sizes), the
// world size they make, the step, and each sharded tensor's shape and rows tiling its dim 0 in rank
// order. Every later read of the manifest relies on these, so an edited one is one clear error.
std::string manifestProblem(const nlohmann::json& m) {
  if (!m.is_object() || !m.contains("format") || m["format"] != kShardedCheckpointFormat) {
    return std::string("not a ") + kShardedCheckpointFormat + " manifest";
  }
  if (!m.contains("files") || !m["files"].is_array() || m["files"].empty()) return "'files' is not a list of files";
  for (const auto& f : m["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("bytes") ||
        !nonNegativeInteger(f["bytes"])) {
      return "a 'files' entry is not {\"name\": ..., \"bytes\": ...}";
    }
    const std::string name = f["name"].get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      return "'files' names '" + name + "', not a file of the checkpoint's directory";
    }
    if (f.contains("checksum") && !f["checksum"].is_string()) return "a 'files' checksum is not a string";
  }
  const size_t world = m["files"].size();
  if (!m.contains("world_size") || !nonNegativeInteger(m["world_size"]) || m["world_size"].get<uint64_t>() != world) {
    return "'world_size' is not the number of files (" + std::to_string(world) + ")";
  }
  if (!m.contains("global_step") || !nonNegativeInteger(m["global_step"])) return "'global_step' is not a step";
  if (!m.contains("tensors") || !m["tensors"].is_object()) return "'tensors' is not a map of tensors";
  for (const auto& [key, t] : m["tensors"].items()) {
    const std::string what = "tensor '" + key + "'";
    if (!t.is_object() || !t.contains("shape") || !t["shape"].is_array() || t["shape"].empty() ||
        !t.contains("rows") || !t["rows"].is_array() || t["rows"].size() != world) {
      return what + " has no shape or not one row range per file";
    }
    for (const auto& d : t["shape"]) {
      if (!nonNegativeInteger(d)) return what + " has a shape that is not a list of sizes";
    }
    uint64_t next = 0;  // the rows of rank r begin where rank r - 1's end
    for (const auto& r : t["rows"]) {
      if (!r.is_array() || r.size() != 2 || !nonNegativeInteger(r[0]) || !nonNegativeInteger(r[1]) ||
          r[0].get<uint64_t>() != next || r[1].get<uint64_t>() < next) {
        return what + "'s row ranges do not follow each other from row 0";
      }
      next = r[1].get<uint64_t>();
    }
    if (next != t["shape"][0].get<uint64_t>()) return what + "'s row ranges do not cover its " + std::to_string(t["shape"][0].get<uint64_t>()) + " rows";
  }
  return "";
}

}  // namespace

nlohmann::json readManifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kShardedManifest).string();
  std::ifstream in(path);
  if (!in) {
    DDP_THROW(CheckpointError, "'", dir, "' is not a complete sharded checkpoint (no ", kShardedManifest,
              ": its write was interrupted)");
  }
  nlohmann::json manifest;
  std::string problem;
  try {
    manifest = nlohmann::json::parse(in);
    problem = manifestProblem(manifest);
  } catch (const nlohmann::json::exception& e) {
    problem = e.what();
  }
  if (!problem.empty()) {
    DDP_THROW(CheckpointError, "'", path, "' is damaged (", problem, "): resume from another checkpoint ",
              "(resume=auto skips this one) or restore its manifest");
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
    const std::string file = (fs::path(path) / f["name"].get<std::string>()).string();
    const auto want = f["bytes"].get<uintmax_t>();
    std::error_code ec;
    const auto bytes = fs::file_size(file, ec);
    if (ec) DDP_THROW(CheckpointError, "'", path, "' misses '", file, "' (", ec.message(), ")");
    if (bytes != want) {
      DDP_THROW(CheckpointError, "'", file, "' has ", bytes, " bytes, its manifest says ", want, " (truncated or replaced)");
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
  // At most 18 digits: a longer step is no checkpoint of ours (std::stoll would throw on it).
  static const std::regex kName(R"(ckpt-(\d{1,18})\.pt)"), kDirName(R"(ckpt-(\d{1,18}))");
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
    const std::string& dir, const std::function<void(const std::string&, const std::string&)>& onSkip,
    const std::vector<std::string>& exclude, OneFileCheck oneFile) {
  const auto all = listCheckpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (std::find(exclude.begin(), exclude.end(), *it) != exclude.end()) continue;
    try {
      // A sharded checkpoint's files are read by the ranks that need them, each verified then.
      if (isShardedCheckpoint(*it)) {
        verifyShardedCheckpoint(*it);
      } else if (oneFile == OneFileCheck::kRead) {
        loadTrainingCheckpoint(*it);
      }
      return *it;
    } catch (const CheckpointError& e) {
      if (onSkip) onSkip(*it, e.what());
    }
  }
  return std::nullopt;
}

int64_t checkpointStep(const std::string& path) {
  static const std::regex kName(R"(ckpt-(\d{1,18})(\.pt)?)");
  std::smatch m;
  const std::string name = fs::path(path).filename().string();
  return std::regex_match(name, m, kName) ? std::stoll(m[1]) : -1;
}

void pruneCheckpoints(const std::string& dir, int64_t keepLast, const std::string& justWritten,
                      const std::function<bool(const std::string&)>& ours) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // writeFileAtomic's temporaries: ".ckpt-….pt.tmp.<pid>"; interrupted sharded writes: ".ckpt-….tmp/".
    if (name.rfind(".ckpt-", 0) == 0 && name.find(".tmp") != std::string::npos) fs::remove_all(entry.path(), ec);
  }
  if (keepLast <= 0) return;
  std::vector<std::string> all;
  for (const std::string& path : listCheckpoints(dir)) {
    if (!ours || ours(path)) all.push_back(path);
  }
  for (size_t i = 0; i + static_cast<size_t>(keepLast) < all.size(); ++i) {
    if (justWritten.empty() || fs::path(all[i]).filename() != fs::path(justWritten).filename()) {
      fs::remove_all(all[i], ec);
    }
  }
}

}  // namespace ddp::checkpoint
