// A directory of training checkpoints: names, the latest valid one, pruning.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ddp/error.h"

namespace ddp::checkpoint {

/// The CheckpointError of a checkpoint whose own files are damaged (its manifest, a rank's file
/// unreadable or not the one the manifest lists), as against one that does not fit the model:
/// Checkpointer::resume goes on to the next older checkpoint past it.
class DamagedCheckpoint : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

constexpr const char* kShardedCheckpointFormat = "ddp-launch-sharded-checkpoint/1";
constexpr const char* kShardedManifest = "manifest.json";

/// "<dir>/ckpt-00000120.pt" for global step 120.
std::string checkpointPath(const std::string& dir, int64_t globalStep);

/// "<dir>/ckpt-00000120" for global step 120: a sharded checkpoint's directory
/// (libddp/checkpoint/sharded_checkpoint.h).
std::string shardedCheckpointPath(const std::string& dir, int64_t globalStep);

/// Whether `path` is a sharded checkpoint's directory (not whether it is complete).
bool isShardedCheckpoint(const std::string& path);

/// A sharded checkpoint's manifest; CheckpointError when it is missing (an interrupted write),
/// damaged (not JSON; files, world size, step or a tensor's shape and rows missing, of the wrong
/// type, or rows that do not tile the tensor's dim 0 in rank order) or of another format.
nlohmann::json readManifest(const std::string& dir);

/// Checks a sharded checkpoint without reading its tensors: the manifest, and every rank's file
/// present with the size the manifest records. CheckpointError naming what is wrong.
void verifyShardedCheckpoint(const std::string& path);

/// Checkpoints in `dir` (files, and sharded checkpoints' directories with their manifest), oldest
/// first (by step). Temporaries of interrupted writes are not listed.
std::vector<std::string> listCheckpoints(const std::string& dir);

/// How latestValidCheckpoint checks a one-file checkpoint: kRead reads and verifies it whole;
/// kByItsReader takes it unread, for a caller that reads it next and goes on past it when it is
/// damaged (Checkpointer::resume: each rank reads the file once, not twice). Sharded checkpoints
/// are checked alike either way (manifest and file sizes; their tensors are read by their users).
enum class OneFileCheck { kRead, kByItsReader };

/// The newest checkpoint that loads and verifies, leaving out those in `exclude`; each one skipped
/// is reported through `onSkip(path, reason)`. nullopt when there is none.
std::optional<std::string> latestValidCheckpoint(
    const std::string& dir, const std::function<void(const std::string&, const std::string&)>& onSkip,
    const std::vector<std::string>& exclude = {}, OneFileCheck oneFile = OneFileCheck::kRead);

/// The global step a checkpoint's name carries ("<dir>/ckpt-00000120.pt" or "<dir>/ckpt-00000120":
/// 120); -1 for any other name.
int64_t checkpointStep(const std::string& path);

/// Deletes leftovers of interrupted writes, and all but the newest `keepLast` of the checkpoints
/// `ours` accepts (all when it is empty): another run's are not counted and never deleted; never
/// `justWritten`, which a run resumed from an older checkpoint writes below newer (damaged) ones.
void pruneCheckpoints(const std::string& dir, int64_t keepLast, const std::string& justWritten = "",
                      const std::function<bool(const std::string&)>& ours = {});

}  // namespace ddp::checkpoint
