// Runs the real ddp-launch with --max_restarts: a failed group is stopped and started again
// with the restart count and a fresh MASTER_PORT, nothing of an old attempt survives, and a
// signal to the launcher ends the loop instead of restarting.
#include <cerrno>
#include <csignal>
#include <thread>

#include <gtest/gtest.h>

#include "tests/launcher/launched_process.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kNproc = 3;

std::string attemptName(const std::string& what, int attempt) { return what + ".a" + std::to_string(attempt); }

class LaunchRestartTest : public ::testing::Test {
 protected:
  void SetUp() override { becomeSubreaper(); }

  // Every worker records its environment and pids under its attempt (pid.a<K>.<rank>,
  // child.a<K>.<rank>: a `sleep 60` it started), waits until the whole attempt has
  // recorded, then runs `action` ($A is the attempt) and waits for its child. `prelude`
  // runs before anything is recorded.
  std::string script(const std::string& action, const std::string& prelude = "") {
    const std::string attempt = "a$TORCHELASTIC_RESTART_COUNT";
    return dir_.writeScript(
        "worker", "A=$TORCHELASTIC_RESTART_COUNT\n" + prelude +
                  "env > \"" + dir_.path() + "/env." + attempt + ".$RANK\"\n"
                  "sleep 60 &\n" + dir_.publish("child." + attempt, "$!") + dir_.publish("pid." + attempt, "$$") +
                  "while [ $(ls \"" + dir_.path() + "\" | grep -c \"^pid\\." + attempt + "\\.\") -lt " +
                  std::to_string(kNproc) + " ]; do sleep 0.01; done\n" + action + "\nwait\n");
  }

  // Rank 1 fails with exit code 3 on attempts 0 and 1; attempt 2 succeeds everywhere.
  std::string failTwiceScript() {
    return script("if [ \"$RANK\" = 1 ] && [ \"$A\" -lt 2 ]; then exit 3; fi\n"
                  "if [ \"$A\" -ge 2 ]; then kill $!; exit 0; fi");
  }

  LaunchResult run(std::vector<std::string> args) {
    LaunchSpec spec;
    spec.args = std::move(args);
    spec.outputDir = dir_.path();
    return runLauncher(spec);
  }

  // Nothing of attempt `attempt` is left: workers reaped (ESRCH), their children gone.
  void expectAttemptGone(int attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const std::vector<pid_t> pids = dir_.readPids(attemptName("pid", attempt), kNproc);
    const std::vector<pid_t> children = dir_.readPids(attemptName("child", attempt), kNproc);
    for (int rank = 0; rank < kNproc; ++rank) {
      ASSERT_GT(pids[rank], 0) << "rank " << rank;
      errno = 0;
      EXPECT_EQ(::kill(pids[rank], 0), -1) << "rank " << rank << " (pid " << pids[rank] << ") still exists";
      EXPECT_EQ(errno, ESRCH);
      ASSERT_GT(children[rank], 0);
      EXPECT_TRUE(waitUntilGone(children[rank], seconds(2))) << "rank " << rank << "'s child survived";
    }
  }

  std::map<std::string, std::string> envOf(int attempt, int rank) {
    return parseEnvFile(dir_.file(attemptName("env", attempt) + "." + std::to_string(rank)));
  }

  ScratchDir dir_;
};

TEST_F(LaunchRestartTest, FailingTwiceSucceedsWithTwoRestartsOnFreshPorts) {
  const LaunchResult result = run({"--nproc_per_node=3", "--max_restarts=2", failTwiceScript()});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.err.find("ddp-launch: rank 1 failed with exit code 3; restarting the group (restart 1/2)\n"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("ddp-launch: rank 1 failed with exit code 3; restarting the group (restart 2/2)\n"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(result.err.find("summary"), std::string::npos) << result.err;  // the job succeeded

  std::vector<std::string> ports;
  for (int attempt = 0; attempt <= 2; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const std::string port = envOf(attempt, 0).at("MASTER_PORT");
    ports.push_back(port);
    for (int rank = 0; rank < kNproc; ++rank) {
      const auto env = envOf(attempt, rank);
      ASSERT_FALSE(env.empty()) << "rank " << rank << " did not run";
      EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), std::to_string(attempt));
      EXPECT_EQ(env.at("DDP_RESTART_COUNT"), std::to_string(attempt));
      EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "2");
      EXPECT_EQ(env.at("MASTER_PORT"), port);  // one port per attempt
      EXPECT_EQ(env.at("RANK"), std::to_string(rank));
    }
  }
  // Each restart's port differs from the one before (an older one may come back by chance).
  EXPECT_NE(ports[1], ports[0]);
  EXPECT_NE(ports[2], ports[1]);
  EXPECT_FALSE(fileExists(dir_.file("env.a3.0")));
  for (int attempt = 0; attempt <= 2; ++attempt) expectAttemptGone(attempt);
}

TEST_F(LaunchRestartTest, OneRestartIsNotEnoughAndTheLastFailureIsReported) {
  const LaunchResult result = run({"--nproc_per_node=3", "--max-restarts", "1", failTwiceScript()});
  ASSERT_EQ(result.code, 3) << result.err;
  EXPECT_NE(result.err.find("restarting the group (restart 1/1)"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("restart 2/"), std::string::npos) << result.err;
  const pid_t failed = dir_.readPids(attemptName("pid", 1), kNproc)[1];
  EXPECT_NE(result.err.find("ddp-launch: rank 1 (pid " + std::to_string(failed) +
                            ") failed with exit code 3; stopped the other 2 workers (after 1 of 1 restarts)\n"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("exit code 3  <- first failure"), std::string::npos) << result.err;
  EXPECT_FALSE(fileExists(dir_.file("env.a2.0")));
  expectAttemptGone(0);
  expectAttemptGone(1);
}

TEST_F(LaunchRestartTest, NoRestartsByDefault) {
  const LaunchResult result = run({"--nproc_per_node=3", failTwiceScript()});
  ASSERT_EQ(result.code, 3) << result.err;
  EXPECT_EQ(result.err.find("restarting"), std::string::npos) << result.err;
  EXPECT_FALSE(fileExists(dir_.file("env.a1.0")));
  expectAttemptGone(0);
}

TEST_F(LaunchRestartTest, SigtermDuringTheRestartLoopStopsEverythingWithoutRestarting) {
  // Attempt 0 fails; attempt 1 runs until the launcher gets SIGTERM.
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=3", "--max_restarts=5",
               script("if [ \"$RANK\" = 1 ] && [ \"$A\" = 0 ]; then exit 3; fi")};
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  ASSERT_TRUE(dir_.waitForFiles({"pid.a1.0", "pid.a1.1", "pid.a1.2"}, seconds(10))) << launcher.stderrText();
  launcher.sendSignal(SIGTERM);
  ASSERT_EQ(launcher.waitFor(seconds(10)), 128 + SIGTERM) << launcher.stderrText();
  const std::string err = launcher.stderrText();
  EXPECT_NE(err.find("restart 1/5"), std::string::npos) << err;
  EXPECT_EQ(err.find("restart 2/5"), std::string::npos) << err;
  EXPECT_NE(err.find("received SIGTERM"), std::string::npos) << err;
  EXPECT_FALSE(fileExists(dir_.file("env.a2.0")));
  expectAttemptGone(0);
  expectAttemptGone(1);
}

TEST_F(LaunchRestartTest, SigtermWhileAFailedGroupStopsPreventsTheRestart) {
  // Rank 0 ignores SIGTERM and marks when it got it: then the launcher is stopping attempt 0
  // after rank 1's failure, and a SIGTERM to the launcher must end the job there.
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=3", "--max_restarts=5", "--shutdown_grace_s=30",
               script("if [ \"$RANK\" = 1 ]; then exit 3; fi\nwhile true; do sleep 0.05; done",
                      "if [ \"$RANK\" = 0 ]; then trap 'touch \"" + dir_.path() + "/stopping\"' TERM; fi\n")};
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  ASSERT_TRUE(dir_.waitForFiles({"stopping"}, seconds(10))) << launcher.stderrText();
  const auto sent = std::chrono::steady_clock::now();
  launcher.sendSignal(SIGTERM);
  ASSERT_EQ(launcher.waitFor(seconds(10)), 3) << launcher.stderrText();  // the first failure's code
  EXPECT_LT(std::chrono::steady_clock::now() - sent, seconds(5));         // SIGKILL, not the 30 s grace
  const std::string err = launcher.stderrText();
  EXPECT_NE(err.find("not restarting the group: the launcher received SIGTERM"), std::string::npos) << err;
  EXPECT_EQ(err.find("restarting the group (restart"), std::string::npos) << err;
  EXPECT_FALSE(fileExists(dir_.file("env.a1.0")));
  expectAttemptGone(0);
}

TEST_F(LaunchRestartTest, LogDirKeepsEachAttemptApart) {
  const LaunchResult result =
      run({"--nproc_per_node=3", "--max_restarts=2", "--log_dir", dir_.file("logs"),
           script("if [ \"$RANK\" = 1 ] && [ \"$A\" -lt 2 ]; then exit 3; fi\n"
                  "if [ \"$A\" -ge 2 ]; then kill $!; exit 0; fi",
                  "echo \"rank $RANK attempt $A\"\n")});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(result.out.empty()) << result.out;
  for (int attempt = 0; attempt <= 2; ++attempt) {
    for (int rank = 0; rank < kNproc; ++rank) {
      const std::string name = "attempt_" + std::to_string(attempt) + "/rank_" + std::to_string(rank) + ".log";
      EXPECT_EQ(readFile(dir_.file("logs/" + name)),
                "rank " + std::to_string(rank) + " attempt " + std::to_string(attempt) + "\n")
          << name;
    }
  }
  EXPECT_FALSE(fileExists(dir_.file("logs/rank_0.log")));
}

}  // namespace
}  // namespace ddp::launcher::testing
