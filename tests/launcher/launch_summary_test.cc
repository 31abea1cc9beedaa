// Runs the real ddp-launch with failing workers and checks what it tells the user: the
// summary of every rank (state, last output lines, the stuck ones) and the --log_dir files.
#include <algorithm>
#include <csignal>

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "tests/launcher/launched_process.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::seconds;

class LaunchSummaryTest : public ::testing::Test {
 protected:
  void SetUp() override { becomeSubreaper(); }

  // Each worker runs `prelude`, records its pid, waits until all `nproc` have, then runs `action`.
  std::string script(int nproc, const std::string& action, const std::string& prelude = "") {
    return dir_.writeScript("worker", prelude + dir_.publish("pid", "$$") + "while [ $(ls \"" + dir_.path() +
                                          "\" | grep -c '^pid\\.') -lt " + std::to_string(nproc) +
                                          " ]; do sleep 0.01; done\n" + action + "\n");
  }

  // run() with the launcher's debug log on, which records each worker's end as it sees it.
  LaunchResult runDebug(std::vector<std::string> args) {
    LaunchSpec spec;
    spec.args = std::move(args);
    spec.env["SPDLOG_LEVEL"] = "debug";
    spec.outputDir = dir_.path();
    return runLauncher(spec);
  }

  LaunchResult run(std::vector<std::string> args) {
    LaunchSpec spec;
    spec.args = std::move(args);
    spec.outputDir = dir_.path();
    return runLauncher(spec);
  }

  // The summary row of `rank`: "ddp-launch:   <rank>  <pid>  <state>".
  std::string row(const std::string& err, int rank, pid_t pid) {
    for (const std::string& line : splitLines(err)) {
      const std::string start = "ddp-launch:   " + std::to_string(rank) + " ";
      if (line.rfind(start, 0) == 0 && line.find(" " + std::to_string(pid) + "  ") != std::string::npos) return line;
    }
    return "";
  }

  ScratchDir dir_;
};

TEST_F(LaunchSummaryTest, ExitCodeOkAndStuckRanksWithTheirLastLines) {
  // Rank 0 finishes; rank 1 prints 7 lines and fails once the launcher has recorded rank 0's end
  // (SPDLOG_LEVEL=debug: it logs "rank 0 (pid P) ended" then, to the stderr file rank 1 reads);
  // rank 2 hangs.
  const std::string errFile = dir_.file("launch.err");
  const LaunchResult result = runDebug(
      {"--nproc_per_node=3",
       script(3, "case $RANK in\n"
                 "0) echo 'rank 0 finished'; exit 0;;\n"
                 "1) until grep -q 'rank 0 (pid [0-9]*) ended' \"" + errFile + "\"; do sleep 0.01; done\n"
                 "   for i in 1 2 3 4 5 6; do echo \"step $i\"; done; echo 'collective timed out' >&2; exit 3;;\n"
                 "*) exec sleep 60;;\n"
                 "esac",
               "if [ \"$RANK\" = 2 ]; then echo 'waiting in allreduce'; fi\n")});
  ASSERT_EQ(result.code, 3) << result.err;
  const std::vector<pid_t> pids = dir_.readPids("pid", 3);
  const std::string& err = result.err;
  EXPECT_NE(err.find("ddp-launch: summary of the 3 ranks on this node:\n"), std::string::npos) << err;
  EXPECT_NE(row(err, 0, pids[0]).find("  ok"), std::string::npos) << err;
  EXPECT_NE(row(err, 1, pids[1]).find("  exit code 3  <- first failure"), std::string::npos) << err;
  EXPECT_NE(row(err, 2, pids[2]).find("  stopped by the launcher (still running when rank 1 failed; ended by SIGTERM)"),
            std::string::npos)
      << err;
  // Rank 1's last 5 lines, in order, right below its row; not the older ones.
  const std::string rank1 = row(err, 1, pids[1]) + "\n";
  const size_t at = err.find(rank1);
  ASSERT_NE(at, std::string::npos);
  const std::vector<std::string> below = splitLines(err.substr(at + rank1.size()));
  ASSERT_GE(below.size(), 5u);
  const std::vector<std::string> expected{"step 3", "step 4", "step 5", "step 6", "collective timed out"};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(below[i].substr(below[i].find("| ") + 2), expected[i]) << err;
  }
  EXPECT_EQ(err.find("| step 2\n"), std::string::npos) << err;
  EXPECT_NE(err.find("| rank 0 finished\n"), std::string::npos) << err;
  EXPECT_NE(err.find("| waiting in allreduce\n"), std::string::npos) << err;
  EXPECT_NE(err.find("ddp-launch: rank 2 was still running when rank 1 failed: if rank 1 reports a timeout"),
            std::string::npos)
      << err;
}

TEST_F(LaunchSummaryTest, SignalIsNamedWithoutTheMemoryHint) {
  const LaunchResult result =
      run({"--nproc_per_node=2", script(2, "ulimit -c 0\nif [ \"$RANK\" = 1 ]; then kill -SEGV $$; fi\nexec sleep 60")});
  ASSERT_EQ(result.code, 128 + SIGSEGV) << result.err;
  const std::vector<pid_t> pids = dir_.readPids("pid", 2);
  EXPECT_NE(row(result.err, 1, pids[1]).find("  killed by SIGSEGV  <- first failure"), std::string::npos)
      << result.err;
  EXPECT_EQ(result.err.find("out of memory"), std::string::npos) << result.err;
}

TEST_F(LaunchSummaryTest, ExternalSigkillHintsAtMemoryButTheLaunchersOwnDoesNot) {
  // The others ignore SIGTERM, so the launcher's SIGKILL ends them after the grace period.
  const LaunchResult result =
      run({"--nproc_per_node=3", "--shutdown_grace_s=0.3",
           script(3, "if [ \"$RANK\" = 1 ]; then kill -KILL $$; fi\nsleep 60 &\nwait", "trap '' TERM\n")});
  ASSERT_EQ(result.code, 128 + SIGKILL) << result.err;
  const std::vector<pid_t> pids = dir_.readPids("pid", 3);
  EXPECT_NE(result.err.find("ddp-launch: rank 1 (pid " + std::to_string(pids[1]) +
                            ") was killed by SIGKILL, possibly out of memory (check dmesg); stopped the other 2 workers"),
            std::string::npos)
      << result.err;
  EXPECT_NE(row(result.err, 1, pids[1]).find("  killed by SIGKILL, possibly out of memory (check dmesg)  <- first"),
            std::string::npos)
      << result.err;
  for (int rank : {0, 2}) {
    const std::string line = row(result.err, rank, pids[rank]);
    EXPECT_NE(line.find("stopped by the launcher (still running when rank 1 failed; killed by SIGKILL after the 0.3 s "
                        "grace period)"),
              std::string::npos)
        << result.err;
    EXPECT_EQ(line.find("memory"), std::string::npos) << line;
  }
}

TEST_F(LaunchSummaryTest, LogDirGetsRawLinesPerRankAndTheConsoleOnlyTheLaunchers) {
  const std::string talk =
      dir_.writeScript("talk", "echo \"out $RANK a\"\necho \"err $RANK\" >&2\necho \"out $RANK b\"\nprintf 'end'\n");
  for (const bool tee : {false, true}) {
    SCOPED_TRACE(tee ? "--tee" : "no --tee");
    const std::string logs = dir_.file(tee ? "tee/logs" : "plain/logs");  // parents are created too
    std::vector<std::string> args{"--nproc_per_node=2", "--log-dir=" + logs, talk};
    if (tee) args.insert(args.begin(), "--tee");
    const LaunchResult result = run(args);
    ASSERT_EQ(result.code, 0) << result.err;
    for (int rank = 0; rank < 2; ++rank) {
      const std::string r = std::to_string(rank);
      std::vector<std::string> lines = splitLines(readFile(logs + "/rank_" + r + ".log"));
      // stdout lines keep their order; stderr's line may land anywhere between them.
      std::vector<std::string> stdoutLines;
      std::copy_if(lines.begin(), lines.end(), std::back_inserter(stdoutLines),
                   [](const std::string& line) { return line.rfind("err", 0) != 0; });
      EXPECT_EQ(stdoutLines, (std::vector<std::string>{"out " + r + " a", "out " + r + " b", "end"}));
      EXPECT_EQ(std::count(lines.begin(), lines.end(), "err " + r), 1) << readFile(logs + "/rank_" + r + ".log");
      EXPECT_EQ(lines.size(), 4u);
      const bool shown = result.out.find("[rank " + r + "] out " + r + " a\n") != std::string::npos;
      EXPECT_EQ(shown, tee) << result.out;
      EXPECT_EQ(result.err.find("[rank " + r + "] err " + r + "\n") != std::string::npos, tee) << result.err;
    }
    if (!tee) {
      EXPECT_TRUE(result.out.empty()) << result.out;
      for (const std::string& line : splitLines(result.err)) EXPECT_EQ(line.rfind("ddp-launch: ", 0), 0u) << line;
    }
  }
}

TEST_F(LaunchSummaryTest, BadLogDirIsOneLineAndExitCodeTwoWithNothingStarted) {
  const std::string marker = dir_.writeScript("marker", "touch \"" + dir_.path() + "/started.$RANK\"");
  const std::string file = dir_.file("marker");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--log_dir=" + file + "/logs", marker}, {"--log_dir", file, marker},
        {"--max_restarts=-2", marker}}) {
    SCOPED_TRACE(args[0]);
    const LaunchResult result = run(args);
    EXPECT_EQ(result.code, 2);
    EXPECT_EQ(splitLines(result.err).size(), 1u) << result.err;
    EXPECT_EQ(result.err.rfind("ddp-launch: ", 0), 0u) << result.err;
    EXPECT_FALSE(fileExists(dir_.file("started.0")));
  }
}

}  // namespace
}  // namespace ddp::launcher::testing
