// Runs the real ddp-launch with workers that fail: the others are stopped, the failure is
// reported and propagated, and no process is left behind.
#include <cerrno>
#include <csignal>

#include <gtest/gtest.h>

#include "tests/launcher/launched_process.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class LaunchFailureTest : public ::testing::Test {
 protected:
  void SetUp() override { becomeSubreaper(); }

  // Every worker starts a `sleep 60` child and publishes both pids; then `action`
  // runs once all `nproc` workers have published (so every pid is on record).
  std::string script(int nproc, const std::string& prelude, const std::string& action) {
    return dir_.writeScript(
        "worker", prelude + "sleep 60 &\n" + dir_.publish("child", "$!") + dir_.publish("pid", "$$") +
                      "while [ $(ls \"" + dir_.path() + "\" | grep -c '^pid\\.') -lt " + std::to_string(nproc) +
                      " ]; do sleep 0.01; done\n" + action + "\nwait\n");
  }

  LaunchResult run(std::vector<std::string> args) {
    LaunchSpec spec;
    spec.args = std::move(args);
    spec.outputDir = dir_.path();
    return runLauncher(spec);
  }

  // Workers were the launcher's children: it must have reaped them, so they are gone
  // entirely (ESRCH), not zombies. Their own children must not run either.
  void expectNothingLeft(int nproc) {
    for (int rank = 0; rank < nproc; ++rank) {
      const pid_t pid = dir_.readPids("pid", nproc)[rank];
      ASSERT_GT(pid, 0);
      errno = 0;
      EXPECT_EQ(::kill(pid, 0), -1) << "rank " << rank << " (pid " << pid << ") still exists";
      EXPECT_EQ(errno, ESRCH);
      const pid_t child = dir_.readPids("child", nproc)[rank];
      ASSERT_GT(child, 0);
      EXPECT_TRUE(waitUntilGone(child, seconds(2))) << "rank " << rank << "'s child " << child << " survived";
    }
  }

  ScratchDir dir_;
};

TEST_F(LaunchFailureTest, FailingRankStopsTheOthersAndSetsTheExitCode) {
  // Grace 30 s: finishing fast proves SIGTERM, not the SIGKILL fallback, stopped them.
  const LaunchResult result = run({"--nproc_per_node=4", "--shutdown_grace_s=30",
                                   script(4, "", "if [ \"$RANK\" = 1 ]; then exit 3; fi")});
  ASSERT_EQ(result.code, 3) << result.err;
  EXPECT_LT(result.elapsed, seconds(10));
  const pid_t failed = dir_.readPids("pid", 4)[1];
  EXPECT_NE(result.err.find("ddp-launch: rank 1 (pid " + std::to_string(failed) +
                            ") failed with exit code 3; stopped the other 3 workers\n"),
            std::string::npos)
      << result.err;
  expectNothingLeft(4);
}

TEST_F(LaunchFailureTest, WorkerKilledBySignalIsNamedAndGives128PlusSignal) {
  const LaunchResult result =
      run({"--nproc_per_node=3", script(3, "ulimit -c 0\n", "if [ \"$RANK\" = 2 ]; then kill -SEGV $$; fi")});
  ASSERT_EQ(result.code, 128 + SIGSEGV) << result.err;
  const pid_t failed = dir_.readPids("pid", 3)[2];
  EXPECT_NE(result.err.find("rank 2 (pid " + std::to_string(failed) + ") was killed by SIGSEGV"), std::string::npos)
      << result.err;
  expectNothingLeft(3);
}

TEST_F(LaunchFailureTest, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  // `trap '' TERM` is inherited by the sleep child too, so only SIGKILL ends either.
  const LaunchResult result = run({"--nproc_per_node=3", "--shutdown-grace-s=0.5",
                                   script(3, "trap '' TERM\n", "if [ \"$RANK\" = 0 ]; then exit 5; fi")});
  ASSERT_EQ(result.code, 5) << result.err;
  EXPECT_GE(result.elapsed, milliseconds(500));
  EXPECT_LT(result.elapsed, seconds(5));
  EXPECT_NE(result.err.find("sending SIGKILL"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("rank 0 (pid"), std::string::npos) << result.err;
  expectNothingLeft(3);
}

TEST_F(LaunchFailureTest, LateFailureAfterTheOthersSucceeded) {
  // Rank 1 fails only once the launcher has recorded that ranks 0 and 2 ended: with SPDLOG_LEVEL=
  // debug it logs "rank N (pid P) ended" as it records an exit, and rank 1 reads its stderr file.
  // (Their pids never go away before the end: the launcher keeps exited workers as zombies.)
  const std::string err = dir_.file("launch.err");
  const std::string late = dir_.publish("pid", "$$") + "if [ \"$RANK\" = 1 ]; then\n" +
                           "  until grep -q 'rank 0 (pid [0-9]*) ended' \"" + err + "\" && grep -q 'rank 2 (pid [0-9]*) ended' \"" +
                           err + "\"; do sleep 0.01; done\n  exit 4\nfi\nexit 0";
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=3", dir_.writeScript("late", late)};
  spec.env["SPDLOG_LEVEL"] = "debug";
  spec.outputDir = dir_.path();
  const LaunchResult result = runLauncher(spec);
  ASSERT_EQ(result.code, 4) << result.err;
  EXPECT_NE(result.err.find("rank 1 (pid " + std::to_string(dir_.readPids("pid", 3)[1]) + ") failed with exit code 4"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(result.err.find("stopped the other"), std::string::npos) << result.err;  // none were left running
}

TEST_F(LaunchFailureTest, SuccessWaitsForTheSlowestWorker) {
  const LaunchResult result = run(
      {"--nproc_per_node=3", dir_.writeScript("slow", "if [ \"$RANK\" = 2 ]; then sleep 0.4; fi\n" +
                                                          dir_.publish("pid", "$$"))});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_GE(result.elapsed, milliseconds(400));
  EXPECT_EQ(result.err.find("rank"), std::string::npos) << result.err;
  for (pid_t pid : dir_.readPids("pid", 3)) {
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1);
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST_F(LaunchFailureTest, WorkersDieWithAKilledLauncher) {
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=2", dir_.writeScript("stay", dir_.publish("pid", "$$") + "exec sleep 60")};
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  ASSERT_TRUE(dir_.waitForFiles({"pid.0", "pid.1"}, seconds(10)));
  // SIGKILL leaves the launcher no chance to clean up: PR_SET_PDEATHSIG must do it.
  launcher.sendSignal(SIGKILL);
  ASSERT_EQ(launcher.waitFor(seconds(10)), 128 + SIGKILL);
  for (pid_t pid : dir_.readPids("pid", 2)) {
    EXPECT_TRUE(waitUntilGone(pid, seconds(5))) << "worker " << pid << " outlived the launcher";
  }
}

}  // namespace
}  // namespace ddp::launcher::testing
