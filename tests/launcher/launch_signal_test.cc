// Runs the real ddp-launch and signals it: every worker gets the same signal, the launcher
// exits 128 + signal, and no process is left behind.
#include <cerrno>
#include <csignal>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "launcher/exit_status.h"
#include "tests/launcher/launched_process.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::seconds;

constexpr int kNproc = 3;

class LaunchSignalTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { becomeSubreaper(); }

  // Starts kNproc workers and returns once all are ready (traps set, pids on record).
  // `traps` runs first in each worker.
  std::unique_ptr<LaunchedProcess> startReady(const std::string& traps, const std::string& grace) {
    const std::string script = dir_.writeScript(
        "worker", traps + "sleep 60 &\n" + dir_.publish("child", "$!") + dir_.publish("pid", "$$") + "wait\n");
    LaunchSpec spec;
    spec.args = {"--nproc_per_node=" + std::to_string(kNproc), "--shutdown_grace_s=" + grace, script};
    spec.outputDir = dir_.path();
    auto launcher = std::make_unique<LaunchedProcess>(spec);
    std::vector<std::string> ready;
    for (int rank = 0; rank < kNproc; ++rank) ready.push_back("pid." + std::to_string(rank));
    EXPECT_TRUE(dir_.waitForFiles(ready, seconds(10))) << launcher->stderrText();
    return launcher;
  }

  void expectNothingLeft() {
    for (int rank = 0; rank < kNproc; ++rank) {
      const pid_t pid = dir_.readPids("pid", kNproc)[rank];
      errno = 0;
      EXPECT_EQ(::kill(pid, 0), -1) << "rank " << rank << " (pid " << pid << ") still exists";
      EXPECT_EQ(errno, ESRCH);
      const pid_t child = dir_.readPids("child", kNproc)[rank];
      EXPECT_TRUE(waitUntilGone(child, seconds(2))) << "rank " << rank << "'s child " << child << " survived";
    }
  }

  ScratchDir dir_;
};

TEST_P(LaunchSignalTest, SignalReachesEveryWorkerAndNothingIsLeft) {
  const int signal = GetParam();
  std::string traps;
  for (const char* name : {"TERM", "INT", "HUP"}) {
    traps += std::string("trap 'echo ") + name + " > \"" + dir_.path() + "/marker.$RANK\"; exit 0' " + name + "\n";
  }
  // Grace 30 s: a quick end proves the workers' traps ran, not the SIGKILL fallback.
  auto launcher = startReady(traps, "30");
  const auto sent = std::chrono::steady_clock::now();
  launcher->sendSignal(signal);
  ASSERT_EQ(launcher->waitFor(seconds(10)), 128 + signal) << launcher->stderrText();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, seconds(5));

  const std::string name = signalName(signal);  // "SIGTERM"
  for (int rank = 0; rank < kNproc; ++rank) {
    EXPECT_EQ(readFile(dir_.file("marker." + std::to_string(rank))), name.substr(3) + "\n") << "rank " << rank;
  }
  EXPECT_NE(launcher->stderrText().find("received " + name), std::string::npos) << launcher->stderrText();
  expectNothingLeft();
}

INSTANTIATE_TEST_SUITE_P(ForwardedSignals, LaunchSignalTest, ::testing::Values(SIGTERM, SIGINT, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& info) { return signalName(info.param); });

TEST_P(LaunchSignalTest, SecondSignalSkipsTheGracePeriod) {
  const int signal = GetParam();
  auto launcher = startReady("trap '' TERM INT HUP\n", "30");
  const auto sent = std::chrono::steady_clock::now();
  launcher->sendSignal(signal);
  // The second signal must find the launcher already in its grace period: wait until it says so.
  ASSERT_TRUE(launcher->waitForStderr("received " + signalName(signal), seconds(10))) << launcher->stderrText();
  launcher->sendSignal(signal);
  ASSERT_EQ(launcher->waitFor(seconds(10)), 128 + signal) << launcher->stderrText();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, seconds(5));
  EXPECT_NE(launcher->stderrText().find("again; sending SIGKILL"), std::string::npos) << launcher->stderrText();
  expectNothingLeft();
}

}  // namespace
}  // namespace ddp::launcher::testing
