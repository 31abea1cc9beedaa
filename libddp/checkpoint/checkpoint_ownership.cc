// The directory a Checkpointer works in, as this job's: rank 0's lock on it, every rank's agreement
// on each save's step, and keepLast over the checkpoints this process wrote or resumed from.
#include <ATen/ops/tensor.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/dir_lock.h"
#include "common/error.h"
#include "ddp/checkpoint.h"
#include "ddp/files.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/checkpoint_ownership.h"

namespace ddp {

void Checkpointer::holdDirectory(ProcessGroup& group, bool create, int64_t step) {
  if (dirHeld_ && step < 0) return;
  std::string error;
  bool held = dirHeld_;
  int64_t ownNewest = -1;  // rank 0: the highest step among this run's checkpoints in the directory
  // A save takes the lock again when the directory went since (deleted while the job ran, its lock
  // file with it: made again here, or refused as another job's); held, lockDirectory is a no-op.
  if (group.rank() == 0 && (!dirHeld_ || step >= 0)) {
    try {
      if (create) makeDirectories(options_.dir, "ddp::CheckpointOptions::dir");
      std::error_code ec;
      if (std::filesystem::is_directory(options_.dir, ec)) {
        const std::string file = kJobLockFile;
        const DirLock lock = lockDirectory(options_.dir, file);
        const std::string refused = dirLockRefusal(lock, options_.dir, file, "ddp::CheckpointOptions::dir");
        if (!refused.empty()) error = "checkpoint: " + options_.dir + refused;
        held = lock.held;  // not openable (a read-only directory to resume from): not locked, nothing to guard
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (group.rank() == 0 && step >= 0 && error.empty()) {
    try {  // rank 0 alone: an error goes to the others through the all-reduce, never a hang
      ownNewest = checkpoint::newestOwnStep(options_.dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // With the step: a save's position must be every rank's (rank 0 writes its own and the others
  // would return the path of a file that does not exist).
  const int64_t mine = std::max<int64_t>(step, 0);
  at::Tensor flags = at::tensor({int64_t{error.empty() ? 0 : 1}, int64_t{held ? 1 : 0}, mine, mine * mine,
                                 ownNewest + 1}, at::kLong)
                         .to(group.collectiveDevice());
  group.allReduce(flags);
  flags = flags.cpu();
  if (!error.empty()) throw CheckpointError(error);
  if (flags[0].item<int64_t>() > 0) {
    DDP_THROW(CheckpointError, "checkpoint: rank 0 could not take ", options_.dir, " for this job (its log says why)");
  }
  dirHeld_ = flags[1].item<int64_t>() > 0;
  const int64_t n = group.size();
  // Every rank's step the same: their sum is n·step and their sum of squares n·step² (only then).
  if (step >= 0 && (flags[2].item<int64_t>() != n * mine || flags[3].item<int64_t>() != n * mine * mine)) {
    DDP_THROW(ConfigError, "ddp::Checkpointer::save: the ranks save different positions (rank ", group.rank(),
              " has globalStep ", step, "); every rank must pass the same TrainPosition");
  }
  // Resume takes the highest step: below one of this run's checkpoints there, a save would never be
  // resumed from (and keepLast would prune it first).
  const int64_t newest = flags[4].item<int64_t>() - 1;
  if (step >= 0 && step < newest) {
    DDP_THROW(ConfigError, "ddp::Checkpointer::save: step ", step, " after step ", newest, " (this run's checkpoint in ",
              options_.dir, "): resume takes the checkpoint of the highest step, so this one would never be resumed; "
              "count TrainPosition::globalStep on from there, or save into another directory");
  }
}

namespace {

// What this process did in a checkpoint directory, whichever Checkpointer did it: the checkpoints
// it wrote, the step it resumed from there, and whether the others there were named.
struct DirHistory {
  std::set<std::string> written;  // file names
  int64_t resumedStep = -1;
  bool othersNamed = false;
};

std::mutex gHistoryMutex;

DirHistory& historyOf(const std::string& dir) {
  static std::map<std::string, DirHistory> histories;  // by real path
  std::error_code ec;
  const auto real = std::filesystem::weakly_canonical(dir, ec);
  return histories[ec ? dir : real.string()];
}

// Whether the checkpoint at `path` is this run's (see CheckpointOptions::keepLast).
bool isOwn(const DirHistory& history, const std::string& path) {
  if (history.written.count(std::filesystem::path(path).filename().string()) != 0) return true;
  const int64_t step = checkpoint::checkpointStep(path);
  return history.resumedStep >= 0 && step >= 0 && step <= history.resumedStep;
}

}  // namespace

void Checkpointer::prune(const std::string& justWritten) {
  const std::lock_guard<std::mutex> lock(gHistoryMutex);
  DirHistory& history = historyOf(options_.dir);
  history.written.insert(std::filesystem::path(justWritten).filename().string());
  checkpoint::pruneCheckpoints(options_.dir, options_.keepLast, justWritten,
                               [&history](const std::string& path) { return isOwn(history, path); });
  if (history.othersNamed) return;
  std::vector<std::string> others;
  for (const std::string& path : checkpoint::listCheckpoints(options_.dir)) {
    if (!isOwn(history, path)) others.push_back(std::filesystem::path(path).filename().string());
  }
  if (others.empty()) return;
  history.othersNamed = true;
  spdlog::warn("checkpoint: {} also holds {} checkpoint(s) this run neither wrote nor resumed from (the newest {}): "
               "they are kept and not counted by keepLast, but a later resume takes the newest checkpoint there, "
               "whichever run wrote it; give each run its own checkpoint directory",
               options_.dir, others.size(), others.back());
}

namespace checkpoint {

void recordResume(const std::string& dir, int64_t step) {
  const std::lock_guard<std::mutex> lock(gHistoryMutex);
  historyOf(dir).resumedStep = step;
}

int64_t newestOwnStep(const std::string& dir) {
  const std::lock_guard<std::mutex> lock(gHistoryMutex);
  const DirHistory& history = historyOf(dir);
  int64_t newest = -1;
  for (const std::string& path : listCheckpoints(dir)) {
    if (isOwn(history, path)) newest = std::max(newest, checkpointStep(path));
  }
  return newest;
}

}  // namespace checkpoint

}  // namespace ddp
