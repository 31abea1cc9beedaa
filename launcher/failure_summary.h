// What the launcher tells the user when a job fails: the cause and a table of every rank.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "launcher/exit_status.h"

namespace ddp::launcher {

/// How one rank ended in one attempt.
struct RankReport {
  int rank = 0;
  pid_t pid = -1;
  ExitStatus status;
  bool stoppedByLauncher = false;  // still running when the launcher began stopping the group
  bool killedByLauncher = false;   // still running when the launcher sent SIGKILL to its group
  bool leftEarly = false;          // exited 0 while the others ran on past the early-exit grace
  bool stoppedBySignal = false;    // was stopped (SIGSTOP, state T) when the first failure came
  std::vector<std::string> lastLines;  // its last output lines, oldest first
  std::string errorFile;               // what it wrote to TORCHELASTIC_ERROR_FILE (readErrorFile), or ""
};

/// How one attempt (the first run or a restart) of the whole group ended.
struct AttemptReport {
  std::vector<RankReport> ranks;        // by local rank
  std::optional<size_t> firstFailure;   // index into ranks: the rank whose failure stopped the group
  int launcherSignal = 0;               // SIGINT/SIGTERM/... the launcher received, 0 if none
  bool failedWhileStopping = false;     // firstFailure came while stopping on launcherSignal
  double shutdownGraceS = 0;            // SIGTERM-to-SIGKILL time used when stopping
  double earlyExitGraceS = 0;           // how long the others ran on after a rank left early
  bool stoppedOnRequest = false;        // SupervisionOptions::stopRequested stopped the group
};

/// Reads after "rank N ": "failed with exit code 3", "failed with exit code 1: ValueError: boom
/// (train.py, line 3, in main)" when it wrote an error file, "was killed by SIGSEGV", or for a SIGKILL
/// the launcher did not send, "was killed by SIGKILL, possibly out of memory (check dmesg)";
/// for a rank that left early, "exited with code 0 while the other ranks ran on for 30 s".
std::string describeFailure(const RankReport& rank);

/// The state column: "ok", "exit code 3", "killed by SIGSEGV", "stopped by the launcher (...)".
std::string describeState(const RankReport& rank, const AttemptReport& attempt);

/// The summary printed when the job ends in failure, one line per element (no "ddp-launch: "):
/// a header, then per rank its rank, pid and state with its last output lines below, then which
/// ranks were still running when the first failure came (the stuck ones, if it was a timeout).
std::vector<std::string> formatFailureSummary(const AttemptReport& attempt);

}  // namespace ddp::launcher
