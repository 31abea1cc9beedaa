// What this process did in a checkpoint directory, for Checkpointer::prune's keepLast
// (libddp/checkpoint/checkpoint_ownership.cc).
#pragma once

#include <cstdint>
#include <string>

namespace ddp::checkpoint {

/// This process resumed from `dir` at `step`: the checkpoints there up to it are this run's.
void recordResume(const std::string& dir, int64_t step);
/// The highest step among the checkpoints in `dir` this process wrote or resumed from there (up to
/// the one resumed from), -1 when none is there (any more).
int64_t newestOwnStep(const std::string& dir);

}  // namespace ddp::checkpoint
