// output.sample_log: every rank's sample indices per step (samples_rank<r>.txt), to check which
// samples each rank saw, across restarts and world sizes.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "common/no_follow.h"

namespace ddp::worker {

class SampleLog {
 public:
  /// Writes `dir`/samples_rank<rank>.txt, from a line naming this run (the restart count and the
  /// world size: a restart redoes the steps after its checkpoint). `append`: a resumed or restarted
  /// run continues the file; a fresh run starts it anew (and rank 0 removes the files of ranks
  /// beyond this world, left by an earlier, larger run). ConfigError when it cannot.
  SampleLog(const std::string& dir, int rank, int world, bool append);
  /// "EPOCH STEP i0 i1 ...", flushed.
  void write(int64_t epoch, int64_t step, const std::vector<int64_t>& indices);
  /// Whether the file it writes is no longer at its path (deleted, or another file put there).
  bool removed() const;

 private:
  std::string path_;
  FileId id_;
  std::ofstream out_;
};

}  // namespace ddp::worker
