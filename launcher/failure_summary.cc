#include "launcher/failure_summary.h"

#include <algorithm>
#include <csignal>
#include <sstream>

namespace ddp::launcher {
namespace {

// A SIGKILL nobody in the job asked for usually comes from the kernel's OOM killer.
bool unexplainedSigkill(const RankReport& rank) {
  return rank.status.signaled && rank.status.signal == SIGKILL && !rank.killedByLauncher;
}

// A stop signal to one worker that the launcher did not forward: someone's kill, a scheduler, a
// container's stop (the launcher marks the workers it stops before it signals them).
bool externalStopSignal(const RankReport& rank) {
  const int s = rank.status.signal;
  return rank.status.signaled && !rank.stoppedByLauncher && !rank.killedByLauncher &&
         (s == SIGTERM || s == SIGINT || s == SIGHUP || s == SIGQUIT);
}

std::string killedBy(const RankReport& rank) {
  std::string text = "killed by " + rank.status.describe();
  if (unexplainedSigkill(rank)) text += ", possibly out of memory (check dmesg)";
  if (externalStopSignal(rank)) text += ", sent from outside ddp-launch (a kill, a scheduler, a container stop)";
  return text;
}

std::string formatSeconds(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

std::string padded(std::string text, size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

}  // namespace

std::string describeFailure(const RankReport& rank) {
  if (rank.leftEarly) {
    return "exited with code 0 before the job ended (the other ranks ran on without it: waiting for it in a "
           "collective, or showing no sign of life)";
  }
  if (!rank.status.signaled) {
    return "failed with " + rank.status.describe() + (rank.errorFile.empty() ? "" : ": " + rank.errorFile);
  }
  return "was " + killedBy(rank);
}

// A rank the launcher was stopping that had written the first failure's error line: it failed the
// same way (every rank refusing one bad config), it was not stuck — whether it then exited with the
// same code on its own or the launcher's stop signal came between its error file and its exit.
// Not one the launcher had to SIGKILL: that one hung on its way out.
bool failedLikeTheFirst(const RankReport& rank, const AttemptReport& attempt) {
  if (!rank.stoppedByLauncher || rank.killedByLauncher || !attempt.firstFailure || attempt.failedWhileStopping) {
    return false;
  }
  const RankReport& first = attempt.ranks[*attempt.firstFailure];
  if (&first == &rank || first.status.signaled) return false;
  if (rank.errorFile.empty() && first.errorFile.empty()) {
    // No error files (a program that writes none: `python missing.py`): the same last line and the
    // same exit code, reached on its own before or despite the launcher's signal.
    return !rank.status.signaled && rank.status.code == first.status.code && !rank.lastLines.empty() &&
           !first.lastLines.empty() && rank.lastLines.back() == first.lastLines.back();
  }
  if (rank.errorFile.empty() || rank.errorFile != first.errorFile) return false;
  return rank.status.signaled || rank.status.code == first.status.code;
}

// The rank's last lines end in a Python traceback — a frame line (`  File "x.py", line 3, in f`)
// and then the exception's (`ValueError: boom`, `torch.distributed.DistBackendError: ...`): a
// script that wrote no error file (no @record) was failing on its own when the launcher stopped it.
bool endsInPythonTraceback(const RankReport& rank) {
  if (rank.lastLines.size() < 2) return false;
  const std::string& last = rank.lastLines.back();
  const size_t nameEnd = last.find(": ") == std::string::npos ? last.size() : last.find(": ");
  const std::string name = last.substr(0, nameEnd);
  if (name.empty() || name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.") !=
                          std::string::npos) {
    return false;
  }
  bool exceptionName = false;
  for (const char* suffix : {"Error", "Exception", "Interrupt", "Exit"}) {
    const std::string tail = suffix;
    exceptionName |= name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  }
  const bool frame = std::any_of(rank.lastLines.begin(), rank.lastLines.end() - 1,
                                 [](const std::string& line) { return line.rfind("  File \"", 0) == 0; });
  return exceptionName && frame;
}

// A rank the launcher stopped that was failing on its own, without the first failure's error file.
bool failingInPython(const RankReport& rank, const AttemptReport& attempt) {
  return rank.stoppedByLauncher && !rank.killedByLauncher && attempt.firstFailure && !attempt.failedWhileStopping &&
         !failedLikeTheFirst(rank, attempt) && endsInPythonTraceback(rank);
}

std::string describeState(const RankReport& rank, const AttemptReport& attempt) {
  if (failedLikeTheFirst(rank, attempt)) {
    const std::string first = std::to_string(attempt.ranks[*attempt.firstFailure].rank);
    if (rank.status.signaled) {
      return "the same error as rank " + first + " (it was exiting when the launcher's " + rank.status.describe() +
             " came)";
    }
    return rank.status.describe() + ", the same error as rank " + first;
  }
  if (!rank.stoppedByLauncher) {
    if (rank.leftEarly) {
      return "exit code 0 while the others still ran " + formatSeconds(attempt.earlyExitGraceS) + " s later";
    }
    if (rank.status.success()) return "ok";
    return rank.status.signaled ? killedBy(rank) : rank.status.describe();
  }
  std::string when;
  if (failingInPython(rank, attempt)) {
    when = "it was failing on its own, its output ending in a Python traceback, when rank " +
           std::to_string(attempt.ranks[*attempt.firstFailure].rank) + " failed";
  } else if (attempt.firstFailure && !attempt.failedWhileStopping) {
    const RankReport& first = attempt.ranks[*attempt.firstFailure];
    when = "still running when rank " + std::to_string(first.rank) + (first.leftEarly ? " left early" : " failed");
    if (rank.stoppedBySignal) when = "stopped (state T, e.g. by SIGSTOP) when rank " + std::to_string(first.rank) + " failed";
  } else {
    when = "still running when the launcher received " + signalName(attempt.launcherSignal);
  }
  std::string how;
  if (rank.status.signaled && rank.status.signal == SIGKILL && rank.killedByLauncher) {
    how = "killed by SIGKILL after the " + formatSeconds(attempt.shutdownGraceS) + " s grace period";
  } else if (rank.status.signaled) {
    how = "ended by " + rank.status.describe();
    if (unexplainedSigkill(rank)) how += ", possibly out of memory (check dmesg)";
  } else {
    how = "then exited with code " + std::to_string(rank.status.code);
  }
  return "stopped by the launcher (" + when + "; " + how + ")";
}

std::vector<std::string> formatFailureSummary(const AttemptReport& attempt) {
  std::vector<std::string> lines;
  lines.push_back("summary of the " + std::to_string(attempt.ranks.size()) + " ranks on this node:");
  size_t pidWidth = 3;
  for (const RankReport& rank : attempt.ranks) pidWidth = std::max(pidWidth, std::to_string(rank.pid).size());
  const size_t rankWidth = 6;
  const std::string indent = "  ";
  lines.push_back(indent + padded("rank", rankWidth) + padded("pid", pidWidth + 2) + "state / last output lines");
  const std::string outputIndent = indent + std::string(rankWidth + pidWidth + 2, ' ') + "| ";
  std::vector<int> stuck;
  std::vector<int> stopped;  // in state T: certainly not answering
  for (size_t i = 0; i < attempt.ranks.size(); ++i) {
    const RankReport& rank = attempt.ranks[i];
    std::string state = describeState(rank, attempt);
    if (attempt.firstFailure && *attempt.firstFailure == i) state += "  <- first failure";
    lines.push_back(indent + padded(std::to_string(rank.rank), rankWidth) +
                    padded(std::to_string(rank.pid), pidWidth + 2) + state);
    // The first failure's error line once: a rank that failed the same way says so in its state.
    if (!rank.errorFile.empty() && !failedLikeTheFirst(rank, attempt)) {
      lines.push_back(outputIndent + "error file: " + rank.errorFile);
    }
    // A rank that failed as the first did needs no line of its own (a worker's other ranks refuse a
    // bad config silently, into their error files).
    if (rank.lastLines.empty() && !failedLikeTheFirst(rank, attempt)) lines.push_back(outputIndent + "(no output)");
    // Without error files, a rank that failed as the first did shows only the lines the first's
    // output has not shown.
    const bool sameAsFirst = failedLikeTheFirst(rank, attempt) && rank.errorFile.empty();
    const auto& firstLines = attempt.firstFailure ? attempt.ranks[*attempt.firstFailure].lastLines : rank.lastLines;
    size_t hidden = 0;
    for (const std::string& line : rank.lastLines) {
      // Our worker prints its error file's one line too: shown once, as the error file.
      if (line == rank.errorFile) continue;
      if (sameAsFirst && std::find(firstLines.begin(), firstLines.end(), line) != firstLines.end()) {
        ++hidden;
        continue;
      }
      lines.push_back(outputIndent + line);
    }
    if (hidden > 0 && hidden == rank.lastLines.size()) {
      lines.push_back(outputIndent + "(the same lines as rank " +
                      std::to_string(attempt.ranks[*attempt.firstFailure].rank) + ")");
    }
    if (rank.stoppedByLauncher && !failedLikeTheFirst(rank, attempt) && !failingInPython(rank, attempt)) {
      stuck.push_back(rank.rank);
    }
    if (rank.stoppedBySignal) stopped.push_back(rank.rank);
  }
  if (attempt.firstFailure && attempt.ranks[*attempt.firstFailure].leftEarly) {
    const int left = attempt.ranks[*attempt.firstFailure].rank;
    lines.push_back("rank " + std::to_string(left) + " exited with code 0 while the others still ran " +
                    formatSeconds(attempt.earlyExitGraceS) + " s later: a worker must not return before every "
                    "rank is done (end with a barrier); --early_exit_grace_s sets how long the others may run on");
  } else if (attempt.firstFailure && !stopped.empty()) {
    const int failed = attempt.ranks[*attempt.firstFailure].rank;
    const bool one = stopped.size() == 1;
    lines.push_back((one ? "rank " : "ranks ") + joinRanks(stopped) + (one ? " was" : " were") +
                    " stopped (state T) when rank " + std::to_string(failed) + " failed: " +
                    (one ? "this is the rank" : "these are the ranks") +
                    " that stopped answering (SIGCONT resumes a stopped process)");
  } else if (attempt.firstFailure && !attempt.failedWhileStopping && !stuck.empty()) {
    const int failed = attempt.ranks[*attempt.firstFailure].rank;
    const bool one = stuck.size() == 1;
    lines.push_back((one ? "rank " : "ranks ") + joinRanks(stuck) + (one ? " was" : " were") +
                    " still running when rank " + std::to_string(failed) + " failed: if rank " +
                    std::to_string(failed) + " reports a timeout in a collective or the rendezvous, " +
                    (one ? "this is the rank" : "these are the ranks") + " that stopped answering");
  }
  return lines;
}

}  // namespace ddp::launcher
