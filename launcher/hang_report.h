// The hang report: from every rank's flight recorder (common/flight_recorder.h), which rank is
// behind and in which collective the others wait for it, which ranks' collectives do not pair
// (different operations or sizes at one sequence number), and the native stack of each lagging
// rank. Printed by the launcher when a collective times out or the ranks' collectives do not pair,
// and written as hang_report.json (Python-readable) to the folder the ranks named.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "common/flight_recorder.h"

namespace ddp::launcher {

/// One rank as the launcher sees it when it reads the rings.
struct RankRing {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;
  bool stopped = false;  // state T
  std::string exit;      // how it ended, when it did ("failed with exit code 1")
  flight::Snapshot ring;
};

/// One thread's stack, innermost frame first (function names, demangled where the tool does).
struct ThreadStack {
  int tid = 0;
  std::vector<std::string> frames;
};

struct RankStack {
  std::string tool;  // "eu-stack", "gdb", or "" when none could read it
  std::string error; // why there is no stack
  std::vector<ThreadStack> threads;  // the main thread first
};

/// The native stack of every thread of `pid`, read by eu-stack (elfutils) or else gdb, attached
/// for a moment (a stopped process stays stopped). At most `timeoutS` seconds.
RankStack readStack(pid_t pid, double timeoutS = 10);

struct HangFinding {
  bool timedOut = false;         // some rank's collective timed out (or failed)
  bool failedOnly = false;       // ... every such one failed (a mismatch the backend saw at once), none timed out
  bool stall = false;            // some collective runs longer than the group's timeout
  std::vector<int> behind;       // ranks that never entered the collective others are in
  uint64_t missingSeq = 0;       // the collective they never entered (world group numbering)
  std::optional<flight::Record> missing;  // what the ranks ahead entered there
  std::vector<int> ahead;        // the ranks that entered it
  // The first sequence number at which the ranks' collectives do not pair.
  uint64_t mismatchSeq = 0;
  std::string mismatchKind;      // "different collectives" | "different sizes" | "different dtypes" | "different roots"
  std::vector<std::pair<int, flight::Record>> mismatchCalls;  // (rank, its call) at mismatchSeq
  /// Worth a report: a collective timed out or stalls, or collectives do not pair.
  bool relevant() const { return timedOut || stall || mismatchSeq != 0; }
  /// The ranks whose stacks the report shows: those behind, else those whose collective has not
  /// finished (at most `limit`).
  std::vector<int> lagging;
};

/// Reads the rings (world group: group 0) at `nowNs`. `stallAfterMs`: a collective running longer
/// than this counts as a stall (0: the ranks' own timeout + 15 s). `awakeSinceNs`: a collective that
/// started before it runs from then (the launcher was stopped until then, most likely with its job:
/// Slurm's scontrol suspend; the time stopped is no stall).
HangFinding analyseRings(const std::vector<RankRing>& ranks, int64_t nowNs, int64_t stallAfterMs = 0,
                         int64_t awakeSinceNs = 0);

/// The report's lines for the launcher's log (no trailing newline), stacks of `stacks` included.
std::vector<std::string> formatHangReport(const std::vector<RankRing>& ranks, const HangFinding& finding,
                                          const std::vector<std::pair<int, RankStack>>& stacks, int64_t nowNs);

/// The same as JSON (hang_report.json).
std::string hangReportJson(const std::vector<RankRing>& ranks, const HangFinding& finding,
                           const std::vector<std::pair<int, RankStack>>& stacks,
                           const std::vector<std::string>& lines, int64_t nowNs);

/// Everything above: analyses; when relevant (with `stallOnly`: when a collective stalls), reads the
/// lagging ranks' stacks, logs the report and writes hang_report.json to the folder the ranks named
/// (if any). Returns whether it reported. `awakeSinceNs`: as analyseRings.
bool reportHang(const std::vector<RankRing>& ranks, bool stallOnly = false, int64_t awakeSinceNs = 0);

}  // namespace ddp::launcher
