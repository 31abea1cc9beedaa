// A directory of training checkpoints: names, the latest valid one, pruning.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddp::checkpoint {

/// "<dir>/ckpt-00000120.pt" for global step 120.
std::string checkpointPath(const std::string& dir, int64_t globalStep);

/// Checkpoint files in `dir`, oldest first (by step). Temporary files of
/// interrupted writes are not listed.
std::vector<std::string> listCheckpoints(const std::string& dir);

/// The newest checkpoint that loads and verifies; each one skipped is reported
/// through `onSkip(path, reason)`. nullopt when there is none.
std::optional<std::string> latestValidCheckpoint(
    const std::string& dir, const std::function<void(const std::string&, const std::string&)>& onSkip);

/// Deletes all but the newest `keepLast` checkpoints, and leftovers of interrupted writes.
void pruneCheckpoints(const std::string& dir, int64_t keepLast);

}  // namespace ddp::checkpoint
