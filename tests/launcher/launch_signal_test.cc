// Runs the real ddp-launch and signals it: every worker gets the same signal, the launcher
// exits 128 + signal, and no process is left behind.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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
  for (const char* name : {"TERM", "INT", "HUP", "USR1", "USR2"}) {
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

// SIGUSR1/SIGUSR2: Slurm's warning before the time limit (--signal=USR1@120), issue 45 (4).
INSTANTIATE_TEST_SUITE_P(ForwardedSignals, LaunchSignalTest, ::testing::Values(SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2),
                         [](const ::testing::TestParamInfo<int>& info) { return signalName(info.param); });

// A copy of the signal within 1 s (`timeout` forwarding it while `kill -- -PGID` also reached the
// launcher) is the same request, absorbed once; the next one skips the grace period.
TEST_P(LaunchSignalTest, ACopyWithinASecondIsAbsorbedTheNextSignalSkipsTheGracePeriod) {
  const int signal = GetParam();
  auto launcher = startReady("trap '' TERM INT HUP USR1 USR2\n", "30");
  const auto sent = std::chrono::steady_clock::now();
  launcher->sendSignal(signal);
  // Each signal must find the launcher done with the one before (pending copies merge): wait until it says so.
  ASSERT_TRUE(launcher->waitForStderr("received " + signalName(signal), seconds(10))) << launcher->stderrText();
  launcher->sendSignal(signal);
  ASSERT_TRUE(launcher->waitForStderr("taken as a copy of the same request", seconds(10))) << launcher->stderrText();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, seconds(1)) << "the copy came too late to be absorbed";
  EXPECT_EQ(launcher->stderrText().find("sending SIGKILL"), std::string::npos) << launcher->stderrText();
  launcher->sendSignal(signal);
  ASSERT_EQ(launcher->waitFor(seconds(10)), 128 + signal) << launcher->stderrText();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, seconds(5));
  EXPECT_NE(launcher->stderrText().find("again; sending SIGKILL"), std::string::npos) << launcher->stderrText();
  expectNothingLeft();
}

// Issue 46 (12): stdout a full pipe nobody reads (`ddp-launch ... | sleep 100`): SIGTERM still ends the
// launcher (it used to wait forever for its console write) and leaves no worker behind.
TEST(LaunchSignalPipe, SigtermEndsTheJobWhileStdoutIsAFullPipe) {
  becomeSubreaper();
  ScratchDir dir;
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  const std::string script = dir.writeScript(
      "flood", dir.publish("pid", "$$") + "while :; do echo 'a line of output that fills the pipe'; done\n");
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=2", "--shutdown_grace_s=1", script};
  spec.outputDir = dir.path();
  spec.stdoutFd = fds[1];
  LaunchedProcess launcher(spec);
  ::close(fds[1]);
  ASSERT_TRUE(dir.waitForFiles({"pid.0", "pid.1"}, seconds(10))) << launcher.stderrText();
  // The launcher's relay is writing once the first bytes arrive; then the test tops the pipe off
  // through a second, non-blocking write end of its own (/proc reopens the pipe with its own flags,
  // leaving the launcher's blocking end as it is) until not even one byte fits. From there nobody
  // reads, and the launcher's next console write blocks.
  int queued = 0;
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (::ioctl(fds[0], FIONREAD, &queued) == 0 && queued == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(queued, 0) << "the launcher never wrote to its stdout";
  const int topUp = ::open(("/proc/self/fd/" + std::to_string(fds[0])).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(topUp, 0) << std::strerror(errno);
  const char byte = 'x';
  while (::write(topUp, &byte, 1) == 1) {
  }
  EXPECT_EQ(errno, EAGAIN) << std::strerror(errno);
  ::close(topUp);
  ::kill(launcher.pid(), SIGTERM);
  const auto code = launcher.waitFor(seconds(20));
  ::close(fds[0]);
  ASSERT_TRUE(code.has_value()) << "ddp-launch still ran 20 s after SIGTERM:\n" << launcher.stderrText();
  EXPECT_EQ(*code, 128 + SIGTERM) << launcher.stderrText();
  for (const pid_t pid : dir.readPids("pid", 2)) EXPECT_TRUE(waitUntilGone(pid, seconds(5))) << "worker " << pid;
}

}  // namespace
}  // namespace ddp::launcher::testing
