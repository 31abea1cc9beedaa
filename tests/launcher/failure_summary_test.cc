// Unit tests of the failure summary's wording: states, the OOM hint and the stuck ranks.
#include "launcher/failure_summary.h"

#include <csignal>

#include <gtest/gtest.h>

namespace ddp::launcher {
namespace {

RankReport rankReport(int rank, ExitStatus status, bool stopped = false, bool killed = false) {
  RankReport report;
  report.rank = rank;
  report.pid = 1000 + rank;
  report.status = status;
  report.stoppedByLauncher = stopped;
  report.killedByLauncher = killed;
  return report;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

TEST(FailureSummary, OnlyASigkillTheLauncherDidNotSendHintsAtMemory) {
  const RankReport external = rankReport(1, ExitStatus::killedBy(SIGKILL));
  EXPECT_EQ(describeFailure(external), "was killed by SIGKILL, possibly out of memory (check dmesg)");
  EXPECT_EQ(describeFailure(rankReport(1, ExitStatus::killedBy(SIGSEGV))), "was killed by SIGSEGV");
  EXPECT_EQ(describeFailure(rankReport(1, ExitStatus::exited(3))), "failed with exit code 3");

  AttemptReport attempt;
  attempt.shutdownGraceS = 0.5;
  attempt.ranks = {rankReport(0, ExitStatus::killedBy(SIGKILL), true, true), external,
                   rankReport(2, ExitStatus::killedBy(SIGTERM), true, false),
                   rankReport(3, ExitStatus::exited(0))};
  attempt.firstFailure = 1;
  EXPECT_EQ(describeState(attempt.ranks[0], attempt),
            "stopped by the launcher (still running when rank 1 failed; killed by SIGKILL after the 0.5 s grace "
            "period)");
  EXPECT_EQ(describeState(attempt.ranks[1], attempt), "killed by SIGKILL, possibly out of memory (check dmesg)");
  EXPECT_EQ(describeState(attempt.ranks[2], attempt),
            "stopped by the launcher (still running when rank 1 failed; ended by SIGTERM)");
  EXPECT_EQ(describeState(attempt.ranks[3], attempt), "ok");
}

// A stop signal that reached one worker without the launcher sending it says so; the same signal
// the launcher sent while stopping the group does not.
TEST(FailureSummary, AStopSignalTheLauncherDidNotSendSaysItCameFromOutside) {
  const std::string outside = ", sent from outside ddp-launch (a kill, a scheduler, a container stop)";
  for (int signal : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
    const RankReport external = rankReport(1, ExitStatus::killedBy(signal));
    EXPECT_EQ(describeFailure(external), "was killed by " + external.status.describe() + outside);
  }
  EXPECT_EQ(describeFailure(rankReport(1, ExitStatus::killedBy(SIGSEGV))), "was killed by SIGSEGV");
  AttemptReport attempt;
  attempt.ranks = {rankReport(0, ExitStatus::killedBy(SIGTERM), true, false),
                   rankReport(1, ExitStatus::killedBy(SIGTERM))};
  attempt.firstFailure = 1;
  EXPECT_EQ(describeState(attempt.ranks[0], attempt),
            "stopped by the launcher (still running when rank 1 failed; ended by SIGTERM)");
  EXPECT_EQ(describeState(attempt.ranks[1], attempt), "killed by SIGTERM" + outside);
}

// Our worker writes its one-line error both to stderr and to TORCHELASTIC_ERROR_FILE: the summary
// shows it once, as the error file, and the rank's other last lines as they were.
TEST(FailureSummary, AnOutputLineThatIsTheErrorFileIsShownOnce) {
  AttemptReport attempt;
  attempt.ranks = {rankReport(0, ExitStatus::exited(2))};
  const std::string error = "worker: config: 'train.lr' must be > 0";
  attempt.ranks[0].errorFile = error;
  attempt.ranks[0].lastLines = {"info mode ddp world 1", error};
  attempt.firstFailure = 0;
  const std::string table = joined(formatFailureSummary(attempt));
  EXPECT_NE(table.find("| error file: " + error + "\n              | info mode ddp world 1\n"), std::string::npos)
      << table;
  EXPECT_EQ(table.find("| " + error), std::string::npos) << table;
}

TEST(FailureSummary, TableHasEveryRankItsLastLinesAndNamesTheStuckOnes) {
  AttemptReport attempt;
  attempt.ranks = {rankReport(4, ExitStatus::exited(0)), rankReport(5, ExitStatus::exited(7)),
                   rankReport(6, ExitStatus::exited(143), true), rankReport(7, ExitStatus::killedBy(SIGTERM), true)};
  attempt.ranks[1].lastLines = {"step 9", "allreduce timed out after 30 s"};
  attempt.firstFailure = 1;
  const std::string table = joined(formatFailureSummary(attempt));
  EXPECT_NE(table.find("rank  pid"), std::string::npos) << table;
  EXPECT_NE(table.find("  4     1004  ok\n"), std::string::npos) << table;
  EXPECT_NE(table.find("  5     1005  exit code 7  <- first failure\n"
                       "              | step 9\n"
                       "              | allreduce timed out after 30 s\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("  6     1006  stopped by the launcher (still running when rank 5 failed; then exited with "
                       "code 143)\n              | (no output)\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("ranks 6, 7 were still running when rank 5 failed"), std::string::npos) << table;

  // Rank 6 ended with rank 5's code and error line (both refused one bad config): not stuck.
  attempt.ranks[1].errorFile = attempt.ranks[2].errorFile = "worker: config: 'mode' is 'dp' but WORLD_SIZE=4";
  attempt.ranks[2].status = ExitStatus::exited(7);
  const std::string same = joined(formatFailureSummary(attempt));
  EXPECT_NE(same.find("  6     1006  exit code 7, the same error as rank 5\n  7 "), std::string::npos)
      << "no '(no output)' line for a rank that failed as the first did:\n" << same;
  EXPECT_NE(same.find("rank 7 was still running when rank 5 failed"), std::string::npos) << same;
  EXPECT_EQ(same.find("1006  exit code 7, the same error as rank 5\n              | error file:"), std::string::npos)
      << "the same error line once, at the first failure:\n" << same;

  // Rank 7 had written the same error when the launcher's SIGTERM came (a race with its exit): not stuck.
  attempt.ranks[3].errorFile = attempt.ranks[1].errorFile;
  const std::string raced = joined(formatFailureSummary(attempt));
  EXPECT_NE(raced.find("  7     1007  the same error as rank 5 (it was exiting when the launcher's SIGTERM came)\n"),
            std::string::npos)
      << raced;
  EXPECT_EQ(raced.find("still running"), std::string::npos) << raced;
  // ... but one the launcher had to SIGKILL after the grace period hung on its way out.
  attempt.ranks[3].status = ExitStatus::killedBy(SIGKILL);
  attempt.ranks[3].killedByLauncher = true;
  EXPECT_NE(joined(formatFailureSummary(attempt)).find("rank 7 was still running when rank 5 failed"), std::string::npos);

  // A Python script without an error file: rank 7's output ends in a traceback (a frame, then the
  // exception's line) when the launcher's SIGTERM came: it was failing on its own, not stuck.
  attempt.ranks[3] = rankReport(7, ExitStatus::killedBy(SIGTERM), true);
  attempt.ranks[3].lastLines = {"Traceback (most recent call last):", "  File \"/tmp/t.py\", line 3, in <module>",
                                "    raise ValueError(\"boom\")", "ValueError: boom"};
  const std::string python = joined(formatFailureSummary(attempt));
  EXPECT_NE(python.find("  7     1007  stopped by the launcher (it was failing on its own, its output ending in a "
                        "Python traceback, when rank 5 failed; ended by SIGTERM)\n"),
            std::string::npos)
      << python;
  EXPECT_EQ(python.find("still running"), std::string::npos) << python;
  // An exception's line without a frame before it is only a line: rank 7 counts as stuck again.
  attempt.ranks[3].lastLines = {"step 10", "RuntimeError: retrying the connection"};
  EXPECT_NE(joined(formatFailureSummary(attempt)).find("rank 7 was still running when rank 5 failed"), std::string::npos);
  attempt.ranks[3].lastLines = {"  File \"/tmp/t.py\", line 3, in <module>", "all good: 3 steps"};
  EXPECT_NE(joined(formatFailureSummary(attempt)).find("rank 7 was still running when rank 5 failed"), std::string::npos);

  // No error files (python missing.py): rank 7 exited with rank 5's code after the same last line
  // on its own; not stuck, and the line is shown once, at the first failure.
  attempt.ranks[1].errorFile = attempt.ranks[2].errorFile = attempt.ranks[3].errorFile = "";
  const std::string missing = "python: can't open file '/tmp/nope.py': [Errno 2] No such file or directory";
  attempt.ranks[1].lastLines = {missing};
  attempt.ranks[2].lastLines = {"an unrelated line"};
  attempt.ranks[3] = rankReport(7, ExitStatus::exited(7), true);
  attempt.ranks[3].lastLines = {missing};
  const std::string script = joined(formatFailureSummary(attempt));
  EXPECT_NE(script.find("  7     1007  exit code 7, the same error as rank 5\n"), std::string::npos) << script;
  EXPECT_EQ(script.find(missing), script.rfind(missing)) << "shown once:\n" << script;
  EXPECT_NE(script.find("1007  exit code 7, the same error as rank 5\n              | (the same lines as rank 5)\n"),
            std::string::npos) << script;
  EXPECT_NE(script.find("rank 6 was still running when rank 5 failed"), std::string::npos)
      << "rank 6's last line is another, rank 7 not named:\n" << script;
  // Another code, or the same line ended by the signal: it may have been stuck, as before.
  attempt.ranks[3].status = ExitStatus::exited(1);
  EXPECT_NE(joined(formatFailureSummary(attempt)).find("ranks 6, 7 were still running when rank 5 failed"), std::string::npos);
  attempt.ranks[3].status = ExitStatus::killedBy(SIGTERM);
  EXPECT_NE(joined(formatFailureSummary(attempt)).find("ranks 6, 7 were still running when rank 5 failed"), std::string::npos);

  attempt.ranks.resize(2);  // nobody was stopped: nobody is called stuck
  EXPECT_EQ(joined(formatFailureSummary(attempt)).find("still running"), std::string::npos);
}

}  // namespace
}  // namespace ddp::launcher
