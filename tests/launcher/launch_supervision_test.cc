// Runs the real ddp-launch on the faults of issue 15 that the launcher must handle: a bad
// configuration (exit 2) is never restarted, restarts back off, a rank that exits 0 while the
// others run on ends the job, a stopped rank is the one named, --master_addr is resolved first,
// grace periods are range-checked, and shared-memory segments of killed workers are removed.
#include <csignal>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ctime>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sched.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/shm_segment_name.h"
#include "launcher/launch_options.h"
#include "launcher/shm_cleanup.h"
#include "launcher/worker_supervisor.h"
#include "tests/launcher/launched_process.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class LaunchSupervisionTest : public ::testing::Test {
 protected:
  void SetUp() override { becomeSubreaper(); }

  LaunchResult run(std::vector<std::string> args, seconds timeout = seconds(30)) {
    LaunchSpec spec;
    spec.args = std::move(args);
    spec.outputDir = dir_.path();
    return runLauncher(spec, timeout);
  }

  // Lines of a file every attempt appends to.
  std::vector<std::string> lines(const std::string& name) { return splitLines(readFile(dir_.file(name))); }

  ScratchDir dir_;
};

// Seconds since boot, as the worker scripts record them (/proc/uptime, 10 ms resolution).
double uptime(const std::string& line) { return std::stod(line); }

TEST_F(LaunchSupervisionTest, ConfigurationErrorExitIsNeverRestarted) {
  const std::string worker =
      dir_.writeScript("worker", "echo $TORCHELASTIC_RESTART_COUNT >> \"" + dir_.file("attempts") + "\"\nexit 2");
  const LaunchResult result = run({"--nproc_per_node=2", "--max_restarts=1000000", worker});
  ASSERT_EQ(result.code, 2) << result.err;
  // Attempt 0 only (a rank may be stopped before it writes its line).
  const std::vector<std::string> attempts = lines("attempts");
  EXPECT_FALSE(attempts.empty());
  for (const std::string& attempt : attempts) EXPECT_EQ(attempt, "0") << result.err;
  EXPECT_NE(result.err.find("not restarting the group: rank "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("exited with code 2 (bad configuration), which every restart would repeat"),
            std::string::npos)
      << result.err;
  EXPECT_LT(result.elapsed, seconds(5));
}

TEST_F(LaunchSupervisionTest, RestartsWaitOneSecondThenTwo) {
  const std::string worker = dir_.writeScript(
      "worker", "cut -d' ' -f1 /proc/uptime >> \"" + dir_.file("starts") + "\"\nexit 3");
  const LaunchResult result = run({"--max_restarts=2", worker});
  ASSERT_EQ(result.code, 3) << result.err;
  const std::vector<std::string> starts = lines("starts");
  ASSERT_EQ(starts.size(), 3u) << result.err;
  // Lower bounds only: a slow machine may take longer, never shorter (10 ms clock resolution).
  EXPECT_GE(uptime(starts[1]) - uptime(starts[0]), 0.99);
  EXPECT_GE(uptime(starts[2]) - uptime(starts[1]), 1.99);
  EXPECT_NE(result.err.find("ddp-launch: restart 1/2 in 1 s"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("ddp-launch: restart 2/2 in 2 s"), std::string::npos) << result.err;
}

TEST(RestartBackoff, DoublesFromOneSecondUpToTheCap) {
  const SupervisionOptions options;  // the defaults ddp-launch uses
  const std::vector<double> expected = {1, 2, 4, 8, 16, 30, 30};
  for (int restart = 1; restart <= 7; ++restart) {
    EXPECT_EQ(restartBackoffSeconds(options, restart), expected[restart - 1]) << "restart " << restart;
  }
  EXPECT_EQ(restartBackoffSeconds(options, 1000000), 30);
}

TEST_F(LaunchSupervisionTest, SigtermDuringTheBackOffEndsTheJobAtOnce) {
  const std::string worker =
      dir_.writeScript("worker", "echo $TORCHELASTIC_RESTART_COUNT >> \"" + dir_.file("attempts") + "\"\nexit 3");
  LaunchSpec spec;
  spec.args = {"--max_restarts=5", worker};
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  // The third wait is 4 s: the signal lands inside it.
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while (launcher.stderrText().find("restart 3/5 in 4 s") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << launcher.stderrText();
    std::this_thread::sleep_for(milliseconds(10));
  }
  const auto sent = std::chrono::steady_clock::now();
  launcher.sendSignal(SIGTERM);
  ASSERT_EQ(launcher.waitFor(seconds(10)), 3) << launcher.stderrText();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, seconds(2));
  EXPECT_NE(launcher.stderrText().find("not restarting the group: the launcher received SIGTERM"), std::string::npos)
      << launcher.stderrText();
  EXPECT_EQ(lines("attempts").size(), 3u) << launcher.stderrText();
}

// Rank 1 returns 0 at once; the others would wait for it in their next collective.
std::string earlyExitScript(const ScratchDir& dir, const std::string& othersWork) {
  return dir.writeScript("worker", dir.publish("pid", "$$") + "if [ \"$RANK\" = 1 ]; then exit 0; fi\n" + othersWork);
}

TEST_F(LaunchSupervisionTest, RankThatExitsZeroWhileOthersRunOnEndsTheJob) {
  const LaunchResult result =
      run({"--nproc_per_node=3", "--early_exit_grace_s=1", earlyExitScript(dir_, "exec sleep 60")});
  ASSERT_EQ(result.code, kEarlyExitCode) << result.err;
  EXPECT_LT(result.elapsed, seconds(10));
  const std::vector<pid_t> pids = dir_.readPids("pid", 3);
  EXPECT_NE(result.err.find("ddp-launch: rank 1 (pid " + std::to_string(pids[1]) +
                            ") exited with code 0 1 s ago and rank(s) 0, 2 have shown no sign of life for 1 s (no CPU "
                            "time, no collective); stopping the job"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("rank 1 (pid " + std::to_string(pids[1]) + ") exited with code 0 before the job ended"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("<- first failure"), std::string::npos) << result.err;
  for (const pid_t pid : pids) EXPECT_TRUE(waitUntilGone(pid, seconds(2))) << pid;
}

// Busy for 3 s: 20000 shell steps per look at the clock, so a loaded machine still shows the CPU
// time; in the rank's own process (the launcher reads its /proc stat) or in a subshell of it.
std::string busyLoopScript(bool inChild) {
  const std::string loop = "end=$(( $(date +%s) + 3 ))\n"
                           "while [ $(date +%s) -lt $end ]; do\n"
                           "  i=0; while [ $i -lt 20000 ]; do i=$((i + 1)); done\n"
                           "done\n";
  return inChild ? "(\n" + loop + ")\n" : loop;
}

// Rank 0 busy on past the grace while rank 1 has returned: the launcher lets it finish.
void expectBusyRankLetFinish(const LaunchResult& result) {
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.err.find("rank 1 exited with code 0 1 s ago; rank(s) 0 still work outside any collective"),
            std::string::npos)
      << result.err;
  EXPECT_GE(result.elapsed, seconds(2));
}

// Issue 45 (5): a rank that works on past the grace (a 35 s save after the others returned) is
// not a hang: torchrun lets it finish, and so does ddp-launch while it uses CPU time (a rank of
// ours, with a flight recorder, while it is in no collective).
TEST_F(LaunchSupervisionTest, ARankThatWorksOnPastTheGraceIsLetFinish) {
  expectBusyRankLetFinish(run({"--nproc_per_node=2", "--early_exit_grace_s=1",
                                      earlyExitScript(dir_, busyLoopScript(/*inChild=*/false))}));
}

// The same work in a child process of the rank (a Python rank 0 running an upload or an evaluation
// script through subprocess; here a subshell): its CPU time counts as the rank's, as torchrun,
// which waits for every rank, would let it finish.
TEST_F(LaunchSupervisionTest, ARankWhoseChildWorksOnPastTheGraceIsLetFinish) {
  expectBusyRankLetFinish(run({"--nproc_per_node=2", "--early_exit_grace_s=1",
                                      earlyExitScript(dir_, busyLoopScript(/*inChild=*/true))}));
}

// A rank that works in bursts with idle seconds between (an upload: a little CPU, then a wait on the
// network; polling; GPU syncs): one idle look after the others returned is no reason to stop it,
// only a whole grace without CPU time is (torchrun waits for it whatever it does).
TEST_F(LaunchSupervisionTest, ARankWorkingInBurstsWithIdleSecondsIsLetFinish) {
  const LaunchResult result = run({"--nproc_per_node=2", "--early_exit_grace_s=3",
                                   earlyExitScript(dir_, "for k in 1 2 3 4; do\n"
                                                         "  i=0; while [ $i -lt 60000 ]; do i=$((i + 1)); done\n"
                                                         "  sleep 1.5\n"
                                                         "done\n")});
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.err.find("still work outside any collective"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("stopping the job"), std::string::npos) << result.err;
}

TEST_F(LaunchSupervisionTest, RanksFinishingWithinTheGraceSucceed) {
  // Rank 0 works on for 0.3 s after rank 1 has returned: a normal finish, not an early exit.
  const LaunchResult result =
      run({"--nproc_per_node=2", "--early_exit_grace_s=10", earlyExitScript(dir_, "sleep 0.3")});
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(result.err.find("stopping the job"), std::string::npos) << result.err;
}

TEST_F(LaunchSupervisionTest, EarlyExitCheckCanBeTurnedOff) {
  const LaunchResult result =
      run({"--nproc_per_node=2", "--early_exit_grace_s=off", earlyExitScript(dir_, "sleep 1.5")});
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_GE(result.elapsed, milliseconds(1500));
}

TEST(EarlyExitGraceOption, DefaultsToThirtySecondsAndIsRangeChecked) {
  const auto parse = [](std::vector<std::string> args) {
    args.push_back("/bin/true");
    return parseCommandLine(args).options;
  };
  EXPECT_EQ(parse({}).earlyExitGraceS, std::optional<double>(30.0));
  EXPECT_EQ(parse({"--early_exit_grace_s=2.5"}).earlyExitGraceS, std::optional<double>(2.5));
  EXPECT_EQ(parse({"--early-exit-grace-s=off"}).earlyExitGraceS, std::nullopt);
  for (const std::string bad : {"-1", "1e308", "inf", "nan", "soon", ""}) {
    try {
      parse({"--early_exit_grace_s=" + bad});
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find("--early_exit_grace_s must be a number of seconds from 0 to 86400"),
                std::string::npos)
          << error.what();
    }
  }
}

TEST(ShutdownGraceOption, HugeValuesAreRefusedNotTurnedIntoAnInstantKill) {
  for (const std::string bad : {"1e308", "86401", "1e10"}) {
    try {
      parseCommandLine({"--shutdown_grace_s=" + bad, "/bin/true"});
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()), "--shutdown_grace_s must be a number of seconds from 0 to 86400 (got '" +
                                               bad + "'), e.g. --shutdown_grace_s=5");
    }
  }
  EXPECT_EQ(parseCommandLine({"--shutdown_grace_s=86400", "/bin/true"}).options.shutdownGraceS, 86400);
}

TEST_F(LaunchSupervisionTest, UnresolvableMasterAddressFailsAtOnceNamingIt) {
  // .invalid never resolves (RFC 6761); an explicit port skips the free-port probe that resolved it before.
  const LaunchResult result =
      run({"--master_addr=not-a-host.invalid", "--master_port=29599", "/bin/sh", "-c", "touch \"" + dir_.file("started") + "\""});
  ASSERT_EQ(result.code, 2) << result.err;
  EXPECT_NE(result.err.find("ddp-launch: --master_addr 'not-a-host.invalid' cannot be resolved ("), std::string::npos)
      << result.err;
  EXPECT_LT(result.elapsed, seconds(10));
  EXPECT_FALSE(fileExists(dir_.file("started")));
}

// Another node than rank 0's may start before rank 0's pod has its DNS name: it waits for the name
// (saying so once) instead of failing at once, and a SIGTERM meanwhile ends it with nothing started.
TEST_F(LaunchSupervisionTest, ANodeOtherThanNodeZeroWaitsForTheMasterAddressToResolve) {
  LaunchSpec spec;
  spec.args = {"--nnodes=2", "--node_rank=1", "--master_addr=not-yet-a-host.invalid", "--master_port=29599",
               "/bin/sh", "-c", "touch \"" + dir_.file("started") + "\""};
  spec.env["DDP_RDZV_TOKEN"] = "0123456789abcdef0123456789abcdef";  // a multi-node job's shared token
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  ASSERT_TRUE(launcher.waitForStderr("--master_addr 'not-yet-a-host.invalid' does not resolve yet (", seconds(10)))
      << launcher.stderrText();
  EXPECT_FALSE(launcher.waitFor(milliseconds(1500)).has_value()) << "it waits\n" << launcher.stderrText();
  launcher.sendSignal(SIGTERM);
  EXPECT_EQ(launcher.waitFor(seconds(10)), std::optional<int>(128 + SIGTERM)) << launcher.stderrText();
  EXPECT_FALSE(fileExists(dir_.file("started")));
}

// torchrun's --tee/--redirects without --log_dir write to a new temporary directory: so do we (a
// manifest written for torchrun runs as it is), and say where.
TEST_F(LaunchSupervisionTest, TeeWithoutALogDirWritesToANewTemporaryOne) {
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=2", "--tee=3", "/bin/sh", "-c", "echo hello from $RANK"};
  spec.env["TMPDIR"] = dir_.path();
  spec.outputDir = dir_.path();
  const LaunchResult result = runLauncher(spec, seconds(30));
  ASSERT_EQ(result.code, 0) << result.err;
  const std::string said = "the rank logs go to " + dir_.path() + "/ddp-launch-logs-";
  const size_t at = result.err.find(said);
  ASSERT_NE(at, std::string::npos) << result.err;
  const std::string logs = dir_.path() + "/ddp-launch-logs-" + result.err.substr(at + said.size(), 6);
  EXPECT_EQ(readFile(logs + "/rank_1.log"), "hello from 1\n");
  EXPECT_NE(result.out.find("hello from 0"), std::string::npos) << "--tee: on the console too\n" << result.out;
}

// A process's state letter in /proc/PID/stat ('T': stopped), polled until `wanted` is (or is not) it.
bool waitForState(pid_t pid, bool stopped, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(") ");
    if (close != std::string::npos && close + 2 < stat.size() && (stat[close + 2] == 'T') == stopped) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a polling interval
  }
  return false;
}

// Ctrl-Z (SIGTSTP) stops the workers with the launcher, and fg (SIGCONT) continues them: in process
// groups of their own they ran on alone, filled the output pipes nobody drained, and the other
// ranks timed out in their collectives (a fault-injection review; torchrun's workers stop with it).
TEST_F(LaunchSupervisionTest, CtrlZStopsTheWorkersWithTheLauncherAndFgContinuesThem) {
  const std::string worker = dir_.writeScript(
      "worker", dir_.publish("pid", "$$") + "while [ ! -f \"" + dir_.file("go") + "\" ]; do sleep 0.02; done\n");
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=2", worker};
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  ASSERT_TRUE(dir_.waitForFiles({"pid.0", "pid.1"}, seconds(10))) << launcher.stderrText();
  const std::vector<pid_t> pids = dir_.readPids("pid", 2);
  launcher.sendSignal(SIGTSTP);
  for (const pid_t pid : {launcher.pid(), pids[0], pids[1]}) {
    EXPECT_TRUE(waitForState(pid, /*stopped=*/true, seconds(10))) << "pid " << pid << " did not stop";
  }
  launcher.sendSignal(SIGCONT);
  for (const pid_t pid : pids) EXPECT_TRUE(waitForState(pid, /*stopped=*/false, seconds(10))) << "pid " << pid;
  std::ofstream(dir_.file("go")) << "1";
  EXPECT_EQ(launcher.waitFor(seconds(20)), 0) << launcher.stderrText();
}

// SIGSTOP then SIGCONT sent to a worker from outside the launcher (Slurm's scontrol suspend and
// resume, a debugger, kill -STOP / -CONT): the worker runs on. The launcher looked for stopped ranks
// at each wake-up, to stop again a rank a hang report's stack tool resumes, and sent SIGSTOP to one
// it saw stopped even when no report ran: a SIGCONT that came between its look and its kill left
// the rank stopped for good, and the job hung (an e2e test that froze its workers met it).
// Each cycle waits for the worker's heartbeat to move on twice after the SIGCONT (three beats after
// the one read before the SIGSTOP: one may come between).
TEST_F(LaunchSupervisionTest, AWorkerStoppedAndContinuedFromOutsideRunsOn) {
  const std::string beat = dir_.file("beat");
  const std::string worker = dir_.writeScript(
      "worker", dir_.publish("pid", "$$") + "if [ \"$RANK\" != 0 ]; then\n  while [ ! -f \"" + dir_.file("go") +
                    "\" ]; do sleep 0.05; done; exit 0\nfi\n" +
                    "i=0\nwhile [ ! -f \"" + dir_.file("go") + "\" ]; do\n" +
                    "  i=$((i + 1)); echo $i > \"" + beat + ".tmp\"; mv \"" + beat + ".tmp\" \"" + beat +
                    "\"; sleep 0.005\ndone\n");
  LaunchSpec spec;
  // Eight ranks, rank 0 the one stopped: the launcher looks at every rank before its kill, which
  // widens the window (by this many /proc reads).
  spec.args = {"--nproc_per_node=8", worker};
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  ASSERT_TRUE(dir_.waitForFiles({"pid.0", "pid.7", "beat"}, seconds(10))) << launcher.stderrText();
  const pid_t pid = dir_.readPids("pid", 8)[0];
  const auto beats = [&] {
    const std::string text = readFile(beat);
    return text.empty() ? 0L : std::stol(text);
  };
  const auto stopped = [pid] {  // /proc/PID/stat's state letter is 'T'
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(") ");
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
  };
  for (int cycle = 0; cycle < 150; ++cycle) {
    const long before = beats();
    ASSERT_EQ(::kill(pid, SIGSTOP), 0);
    // Continued while the launcher, woken by the stop's SIGCHLD, may be looking at it: seen stopped
    // by a spin (not waitForState's polling interval), then after a delay swept over 0-450 us, so
    // that some SIGCONTs land between its look and its kill (~150 us apart here). Not a wait for an
    // event: the cycle's check below waits for the heartbeat.
    const auto limit = std::chrono::steady_clock::now() + seconds(10);
    while (!stopped() && std::chrono::steady_clock::now() < limit) sched_yield();
    ASSERT_TRUE(stopped()) << "cycle " << cycle;
    std::this_thread::sleep_for(std::chrono::microseconds(cycle * 3));
    ASSERT_EQ(::kill(pid, SIGCONT), 0);
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (beats() < before + 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(2));  // a polling interval
    }
    ASSERT_GE(beats(), before + 3) << "cycle " << cycle << ": the worker stopped again after SIGCONT\n"
                                   << launcher.stderrText();
  }
  std::ofstream(dir_.file("go")) << "1";
  EXPECT_EQ(launcher.waitFor(seconds(20)), 0) << launcher.stderrText();
}

// A worker that reads the terminal (input(), pdb, breakpoint()) under a launcher started from it: the
// worker, a background process group of the launcher's terminal, was stopped by SIGTTIN and the job
// waited for ever, its prompt never shown (no newline). Now a session of its own, as torchrun's
// workers: the prompt is drawn at once and the answer read.
TEST_F(LaunchSupervisionTest, AWorkerReadsTheTerminalItsLauncherWasStartedFrom) {
  const std::string worker = dir_.writeScript("worker", "printf 'type> '\nread answer\necho \"got $answer\"\n");
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const std::string slave = ::ptsname(master);
  const std::string launcherBin = DDP_LAUNCH_BIN;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // a login shell's job: a session whose controlling terminal is the pty
    ::setsid();
    const int tty = ::open(slave.c_str(), O_RDWR);  // becomes the controlling terminal
    if (tty < 0) ::_exit(126);
    for (int fd = 0; fd < 3; ++fd) ::dup2(tty, fd);
    ::execl(launcherBin.c_str(), launcherBin.c_str(), "--nproc_per_node=1", worker.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string seen;
  auto readUntil = [&](const std::string& text) {
    char buffer[4096];
    pollfd readable{master, POLLIN, 0};
    while (seen.find(text) == std::string::npos && ::poll(&readable, 1, 20000) == 1) {
      const ssize_t count = ::read(master, buffer, sizeof buffer);
      if (count <= 0) break;
      seen.append(buffer, static_cast<size_t>(count));
    }
    return seen.find(text) != std::string::npos;
  };
  EXPECT_TRUE(readUntil("[rank 0] type> ")) << "no prompt in: " << seen;
  ASSERT_EQ(::write(master, "abc\n", 4), 4);
  EXPECT_TRUE(readUntil("got abc")) << "no answer in: " << seen;  // its line: "[rank 0] type> got abc"
  int status = 0;
  if (seen.find("got abc") == std::string::npos) ::kill(pid, SIGKILL);  // its worker dies with it
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << seen;
  ::close(master);
}

// torchrun's --nnodes=1:1 (an elastic job of one node at most) runs as torchrun runs it: no other
// node can join, so it needs no shared token file (it was refused, asking for --rdzv_token_file).
TEST_F(LaunchSupervisionTest, AnElasticJobOfOneNodeAtMostNeedsNoTokenFile) {
  const std::string worker = dir_.writeScript("worker", "echo \"$WORLD_SIZE\" > \"" + dir_.file("world") + ".$RANK\"\n");
  LaunchSpec spec;
  spec.args = {"--nnodes=1:1", "--nproc_per_node=2", "--master_port=0", worker};
  spec.env = {{"DDP_RDZV_TOKEN", std::nullopt}, {"DDP_RDZV_TOKEN_FILE", std::nullopt}};
  spec.outputDir = dir_.path();
  const LaunchResult result = runLauncher(spec, seconds(60));
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(readFile(dir_.file("world.0")), "2\n");
  EXPECT_EQ(readFile(dir_.file("world.1")), "2\n");
}

TEST_F(LaunchSupervisionTest, StoppedRankIsTheOneNamedWhenAnotherTimesOut) {
  // Rank 2 stops itself; rank 0 then fails as a collective timeout would. Ranks 1 and 3 run on.
  const std::string worker = dir_.writeScript(
      "worker", dir_.publish("pid", "$$") +
                    "if [ \"$RANK\" = 2 ]; then kill -STOP $$; fi\n"
                    "if [ \"$RANK\" = 0 ]; then\n"
                    "  while [ ! -f \"" + dir_.file("pid.2") + "\" ]; do sleep 0.01; done\n"
                    "  P=$(cat \"" + dir_.file("pid.2") + "\")\n"
                    "  until grep -q ') [Tt] ' /proc/$P/stat; do sleep 0.01; done\n"
                    "  echo 'timed out waiting for the others'; exit 1\n"
                    "fi\n"
                    "exec sleep 60");
  const LaunchResult result = run({"--nproc_per_node=4", "--shutdown_grace_s=1", worker});
  ASSERT_EQ(result.code, 1) << result.err;
  EXPECT_NE(result.err.find("rank 2 was stopped (state T) when rank 0 failed: this is the rank that stopped answering"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(result.err.find("ranks 1, 2, 3 were still running"), std::string::npos) << result.err;
  for (const pid_t pid : dir_.readPids("pid", 4)) EXPECT_TRUE(waitUntilGone(pid, seconds(2))) << pid;
}

// A worker that fails at stopping (its preemption checkpoint hit a full disk) is not a clean
// preemption: the launcher's exit code is the worker's, not 128 + SIGTERM.
TEST_F(LaunchSupervisionTest, WorkerFailingAtItsPreemptionSaveIsNotReportedAsAPreemption) {
  const std::string worker = dir_.writeScript(
      "worker", "if [ \"$RANK\" = 0 ]; then trap 'echo cannot save: No space left on device; exit 1' TERM;\n"
                "else trap 'exit 143' TERM; fi\n" +
                    dir_.publish("pid", "$$") + "while true; do sleep 0.05; done");
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=2", worker};
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  ASSERT_TRUE(dir_.waitForFiles({"pid.0", "pid.1"}, seconds(10))) << launcher.stderrText();
  launcher.sendSignal(SIGTERM);
  ASSERT_EQ(launcher.waitFor(seconds(10)), 1) << launcher.stderrText();
  const std::string err = launcher.stderrText();
  const pid_t rank0 = dir_.readPids("pid", 1)[0];
  EXPECT_NE(err.find("ddp-launch: rank 0 (pid " + std::to_string(rank0) +
                     ") failed with exit code 1 while stopping on SIGTERM; what it was saving may be incomplete"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("failed with exit code 1 while the job stopped on SIGTERM"), std::string::npos) << err;
  EXPECT_NE(err.find("cannot save: No space left on device"), std::string::npos) << err;
}

TEST_F(LaunchSupervisionTest, WorkersThatStopCleanlyOnSigtermGive143) {
  const std::string worker = dir_.writeScript(
      "worker", "trap 'exit 143' TERM\n" + dir_.publish("pid", "$$") + "while true; do sleep 0.05; done");
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=2", worker};
  spec.outputDir = dir_.path();
  LaunchedProcess launcher(spec);
  ASSERT_TRUE(dir_.waitForFiles({"pid.0", "pid.1"}, seconds(10))) << launcher.stderrText();
  launcher.sendSignal(SIGTERM);
  ASSERT_EQ(launcher.waitFor(seconds(10)), 128 + SIGTERM) << launcher.stderrText();
  EXPECT_EQ(launcher.stderrText().find("summary"), std::string::npos) << launcher.stderrText();
}

TEST(ShmCleanup, RemovesOnlyTheSegmentsOfTheGivenPids) {
  ScratchDir shm;
  for (const std::string& name : std::vector<std::string>{shmSegmentPrefix(123) + "1", shmSegmentPrefix(123) + "2", shmSegmentPrefix(1234) + "3",
                                 shmSegmentPrefix(456) + "4", "other-123"}) {
    std::ofstream(shm.file(name)) << "x";
  }
  std::vector<std::string> removed = removeShmSegments({123, 456}, shm.path());
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{shmSegmentPrefix(123) + "1", shmSegmentPrefix(123) + "2",
                                               shmSegmentPrefix(456) + "4"}));
  EXPECT_TRUE(fileExists(shm.file(shmSegmentPrefix(1234) + "3")));
  EXPECT_TRUE(fileExists(shm.file("other-123")));
  EXPECT_FALSE(fileExists(shm.file(shmSegmentPrefix(123) + "1")));
}

// A launcher SIGKILLed with its workers during start-up (a scheduler ending the step) leaves rank 0's
// segment with nobody to remove it (a fault-injection review: 12 MiB each time); the next launcher
// removes this user's segments whose maker is gone, once older than a start-up takes.
TEST(ShmCleanup, OrphanedSegmentsOfAGoneMakerAreRemovedOnceOld) {
  ScratchDir shm;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // reaped: its pid names nobody now
  const auto age = [&](const std::string& name, int seconds) {
    std::ofstream(shm.file(name)) << "x";
    const timespec when[2] = {{std::time(nullptr) - seconds, 0}, {std::time(nullptr) - seconds, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, shm.file(name).c_str(), when, 0), 0);
  };
  const std::string gone = shmSegmentPrefix(child) + "a1", fresh = shmSegmentPrefix(child) + "b2",
                    alive = shmSegmentPrefix(::getpid()) + "c3";
  age(gone, 700);
  age(fresh, 5);
  age(alive, 700);
  age("ddp-launch-notapid-d4", 700);
  EXPECT_EQ(removeOrphanedShmSegments(shm.path(), 600), std::vector<std::string>{gone});
  EXPECT_FALSE(fileExists(shm.file(gone)));
  EXPECT_TRUE(fileExists(shm.file(fresh)));   // perhaps a job starting now in another pid namespace
  EXPECT_TRUE(fileExists(shm.file(alive)));   // its maker runs
  EXPECT_TRUE(fileExists(shm.file("ddp-launch-notapid-d4")));
}

TEST_F(LaunchSupervisionTest, SegmentOfAWorkerKilledDuringStartUpIsRemoved) {
  // Rank 0 creates its segment as the shm backend names it, then is stopped by rank 1's failure
  // before it could unlink it (SIGTERM kills a worker that has not started training).
  const std::string worker = dir_.writeScript(
      "worker", "if [ \"$RANK\" = 0 ]; then echo x > /dev/shm/ddp-launch-$$-1234; fi\n" + dir_.publish("pid", "$$") +
                    "if [ \"$RANK\" = 1 ]; then\n"
                    "  while [ ! -f \"" + dir_.file("pid.0") + "\" ]; do sleep 0.01; done\n"
                    "  exit 1\n"
                    "fi\n"
                    "exec sleep 60");
  const std::string unrelated = "/dev/shm/" + shmSegmentPrefix(getpid()) + "unrelated";
  std::ofstream(unrelated) << "x";
  const LaunchResult result = run({"--nproc_per_node=2", worker});
  ASSERT_EQ(result.code, 1) << result.err;
  const pid_t rank0 = dir_.readPids("pid", 1)[0];
  ASSERT_GT(rank0, 0);
  EXPECT_FALSE(fileExists("/dev/shm/" + shmSegmentPrefix(rank0) + "1234")) << result.err;
  EXPECT_NE(result.err.find("removed the shared-memory segment /dev/shm/" + shmSegmentPrefix(rank0) + "1234"),
            std::string::npos)
      << result.err;
  EXPECT_TRUE(fileExists(unrelated));  // not the job's
  ::unlink(unrelated.c_str());
}

// A launcher SIGKILLed (or killed for memory) cannot remove its error-file directory; the next
// launcher on the host (in the same pid namespace) removes this user's whose launcher pid is gone,
// and no other.
TEST_F(LaunchSupervisionTest, ErrorFileDirectoriesOfLaunchersThatAreGoneAreRemoved) {
  const std::string tmp = dir_.file("tmp");
  std::filesystem::create_directories(tmp);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::string pidNamespace = std::filesystem::read_symlink("/proc/self/ns/pid").string();  // pid:[N]
  const std::string ns = pidNamespace.substr(5, pidNamespace.size() - 6);
  const std::string prefix = "ddp-launch-errors-" + std::string(host) + "-" + ns + "-";
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);  // reaped: no process has this pid now
  const std::string orphan = tmp + "/" + prefix + std::to_string(gone) + "-Ab12Cd";
  const std::string live = tmp + "/" + prefix + std::to_string(::getpid()) + "-Ab12Cd";
  const std::string otherHost = tmp + "/ddp-launch-errors-not-" + std::string(host) + "-" + ns + "-" +
                                std::to_string(gone) + "-Ab12Cd";
  // Another container's launcher on this host: a pid of its namespace, not one to look up here.
  const std::string otherNamespace = tmp + "/ddp-launch-errors-" + std::string(host) + "-1" + ns + "-" +
                                     std::to_string(gone) + "-Ab12Cd";
  for (const auto& d : {orphan, live, otherHost, otherNamespace}) std::filesystem::create_directories(d);
  std::ofstream(orphan + "/rank_0.json") << R"({"message": "left behind"})";
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=1", "/bin/true"};
  spec.env["TMPDIR"] = tmp;
  spec.outputDir = dir_.path();
  const LaunchResult result = runLauncher(spec, seconds(30));
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_FALSE(std::filesystem::exists(orphan));
  EXPECT_TRUE(std::filesystem::exists(live));       // its launcher (this test) runs
  EXPECT_TRUE(std::filesystem::exists(otherHost));  // another host's pids mean nothing here
  EXPECT_TRUE(std::filesystem::exists(otherNamespace));
  int left = 0;  // the launcher's own directory went with it: only the three kept
  for (const auto& e : std::filesystem::directory_iterator(tmp)) left += e.path().filename().string().rfind("ddp-launch-errors-", 0) == 0;
  EXPECT_EQ(left, 3);
}

}  // namespace
}  // namespace ddp::launcher::testing
