#include "launcher/worker_supervisor.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "launcher/exit_status.h"
#include "launcher/failure_summary.h"
#include "launcher/output_relay.h"
#include "launcher/signal_watch.h"
#include "launcher/worker_process.h"

namespace ddp::launcher {
namespace {

// Upper bound on one wait, though SIGCHLD normally wakes the loop at once.
constexpr std::chrono::milliseconds kPollInterval{1000};

std::string workers(size_t count) { return std::to_string(count) + (count == 1 ? " worker" : " workers"); }

// The state machine behind runWorkers(), one instance per launch.
class WorkerSupervisor {
 public:
  WorkerSupervisor(SignalWatch& signals, double shutdownGraceS);
  // Kills (SIGKILL to each process group) and reaps whatever is still there.
  ~WorkerSupervisor();
  WorkerSupervisor(const WorkerSupervisor&) = delete;
  WorkerSupervisor& operator=(const WorkerSupervisor&) = delete;

  // Starts one worker; its output goes through `relay` (not started yet).
  void start(int rank, const WorkerCommand& command, OutputRelay& relay);

  // Watches until every worker has exited, stopping them all when one fails or a
  // forwarded signal arrives; reaps them; returns how each ended (without output lines).
  AttemptReport monitor();

 private:
  using Clock = std::chrono::steady_clock;

  struct Worker {
    int rank = 0;
    pid_t pid = -1;  // also the process-group id
    bool exited = false;  // exit seen with WNOWAIT: the zombie keeps the pid and group id ours
    bool reaped = false;
    bool stoppedByLauncher = false;  // still running when beginStop() came
    bool killedByLauncher = false;   // still running when killAll() came
    ExitStatus status;
  };

  // Records exits of workers that have ended, without reaping them.
  void pollExits();
  void onExit(Worker& worker);
  void beginStop(int signal);
  void killAll();
  void reapAll();
  size_t running() const;

  SignalWatch& signals_;
  std::chrono::duration<double> grace_;
  std::vector<Worker> workers_;
  std::optional<size_t> firstFailure_;  // index into workers_
  int launcherSignal_ = 0;              // forwarded signal that started the stop, if any
  bool stopping_ = false;
  bool killed_ = false;                 // SIGKILL sent to every group
  Clock::time_point killAt_;
};

WorkerSupervisor::WorkerSupervisor(SignalWatch& signals, double shutdownGraceS)
    : signals_(signals), grace_(shutdownGraceS) {}

WorkerSupervisor::~WorkerSupervisor() {
  if (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.reaped; })) {
    killAll();
    reapAll();
  }
}

void WorkerSupervisor::start(int rank, const WorkerCommand& command, OutputRelay& relay) {
  const StartedWorker started = startWorker(command);
  Worker worker;
  worker.rank = rank;
  worker.pid = started.pid;
  workers_.push_back(worker);
  spdlog::debug("started rank {} as pid {}: {}", rank, started.pid, command.path);
  relay.add(started.stdoutFd, rank, false);
  relay.add(started.stderrFd, rank, true);
}

AttemptReport WorkerSupervisor::monitor() {
  while (true) {
    pollExits();
    if (running() == 0) break;
    auto timeout = kPollInterval;
    if (stopping_ && !killed_) {
      const auto now = Clock::now();
      if (now >= killAt_) {
        for (const Worker& worker : workers_) {
          if (worker.exited) continue;
          spdlog::warn("rank {} (pid {}) still running {} s after {}; sending SIGKILL", worker.rank, worker.pid,
                       grace_.count(), signalName(launcherSignal_ != 0 ? launcherSignal_ : SIGTERM));
        }
        killAll();
        continue;
      }
      timeout = std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(killAt_ - now));
    }
    const int signal = signals_.wait(timeout);
    if (signal == 0 || !signals_.isForwarded(signal)) continue;  // SIGCHLD or timeout: poll again
    if (!stopping_) {
      spdlog::warn("received {}; forwarding it to {} (SIGKILL after {} s)", signalName(signal),
                   workers(running()), grace_.count());
      launcherSignal_ = signal;
      beginStop(signal);
    } else if (!killed_) {
      spdlog::warn("received {} {}; sending SIGKILL to {}", signalName(signal),
                   launcherSignal_ != 0 ? "again" : "while stopping the workers", workers(running()));
      if (launcherSignal_ == 0) launcherSignal_ = signal;  // no restart after this attempt
      killAll();
    } else if (launcherSignal_ == 0) {
      launcherSignal_ = signal;
    }
  }
  // Children the workers left behind in their groups; the zombies keep the group ids ours.
  if (stopping_) killAll();
  reapAll();

  AttemptReport report;
  report.firstFailure = firstFailure_;
  report.launcherSignal = launcherSignal_;
  report.shutdownGraceS = grace_.count();
  for (const Worker& worker : workers_) {
    RankReport rank;
    rank.rank = worker.rank;
    rank.pid = worker.pid;
    rank.status = worker.status;
    rank.stoppedByLauncher = worker.stoppedByLauncher;
    rank.killedByLauncher = worker.killedByLauncher;
    report.ranks.push_back(rank);
  }
  return report;
}

void WorkerSupervisor::pollExits() {
  for (Worker& worker : workers_) {
    if (worker.exited) continue;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(worker.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      DDP_ENFORCE(errno == EINTR, "waitid(", worker.pid, ") failed, errno ", errno);
      continue;
    }
    if (info.si_pid == 0) continue;  // still running
    worker.exited = true;
    if (info.si_code == CLD_EXITED) {
      worker.status = ExitStatus::exited(info.si_status);
    } else {
      worker.status = ExitStatus::killedBy(info.si_status);
      worker.status.coreDumped = info.si_code == CLD_DUMPED;
    }
    onExit(worker);
  }
}

void WorkerSupervisor::onExit(Worker& worker) {
  spdlog::debug("rank {} (pid {}) ended: {}", worker.rank, worker.pid, worker.status.describe());
  // Exits after a stop began are its consequence, not news.
  if (worker.status.success() || stopping_) return;
  firstFailure_ = static_cast<size_t>(&worker - workers_.data());
  beginStop(SIGTERM);
}

void WorkerSupervisor::beginStop(int signal) {
  stopping_ = true;
  for (Worker& worker : workers_) worker.stoppedByLauncher = !worker.exited;
  killAt_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace_);
  // Exited workers' groups too: their children may still run, and the zombie leader
  // guarantees the group id has not been reused.
  for (const Worker& worker : workers_) {
    if (!worker.reaped) ::kill(-worker.pid, signal);
  }
}

void WorkerSupervisor::killAll() {
  killed_ = true;
  for (Worker& worker : workers_) {
    if (!worker.exited) worker.killedByLauncher = true;
    if (!worker.reaped) ::kill(-worker.pid, SIGKILL);
  }
}

void WorkerSupervisor::reapAll() {
  for (Worker& worker : workers_) {
    if (worker.reaped) continue;
    int status = 0;
    pid_t result;
    do {
      result = ::waitpid(worker.pid, &status, 0);
    } while (result < 0 && errno == EINTR);
    worker.reaped = true;
    if (!worker.exited && result == worker.pid) {
      worker.exited = true;
      worker.status = ExitStatus::fromWaitStatus(status);
    }
  }
}

size_t WorkerSupervisor::running() const {
  return static_cast<size_t>(std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.exited; }));
}

}  // namespace

namespace {

// Opens rank `rank`'s log file for this attempt, creating attempt_<K>/ when the layout has one.
int openRankLog(const LaunchPlan& plan, int rank) {
  const std::string path = rankLogPath(plan, rank);
  const std::string dir = path.substr(0, path.rfind('/'));
  if (dir != plan.logDir && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    DDP_THROW(ConfigError, "--log_dir: cannot create '", dir, "' (", std::strerror(errno), ")");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) DDP_THROW(ConfigError, "--log_dir: cannot write '", path, "' (", std::strerror(errno), ")");
  return fd;
}

// One run of the whole group, from start to the last worker reaped.
AttemptReport runAttempt(const LaunchPlan& plan, SignalWatch& signals) {
  OutputRelayOptions relayOptions;
  relayOptions.console = plan.outputToConsole();
  // Declared before the supervisor so it outlives it: the final drain comes after reaping.
  OutputRelay relay(relayOptions);
  if (!plan.logDir.empty()) {
    for (int rank : plan.ranks) relay.addLogFile(rank, openRankLog(plan, rank));
  }
  WorkerSupervisor supervisor(signals, plan.shutdownGraceS);
  for (size_t i = 0; i < plan.commands.size(); ++i) supervisor.start(plan.ranks[i], plan.commands[i], relay);
  relay.start();
  AttemptReport report = supervisor.monitor();
  relay.finish();
  for (RankReport& rank : report.ranks) rank.lastLines = relay.lastLines(rank.rank);
  return report;
}

// A forwarded signal that arrived after the attempt's monitor returned, or 0.
int pendingSignal(SignalWatch& signals) {
  while (const int signal = signals.wait(std::chrono::milliseconds(0))) {
    if (signals.isForwarded(signal)) return signal;
  }
  return 0;
}

}  // namespace

int runWorkers(const LaunchPlan& initialPlan) {
  SignalWatch signals;
  LaunchPlan plan = initialPlan;
  while (true) {
    spdlog::debug("attempt {}: MASTER_PORT={}", plan.attempt, plan.masterPort);
    const AttemptReport report = runAttempt(plan, signals);
    if (!report.firstFailure) return report.launcherSignal != 0 ? 128 + report.launcherSignal : 0;

    const RankReport& failed = report.ranks[*report.firstFailure];
    const int signal = report.launcherSignal != 0 ? report.launcherSignal : pendingSignal(signals);
    if (plan.attempt < plan.maxRestarts) {
      if (signal == 0) {
        spdlog::warn("rank {} {}; restarting the group (restart {}/{})", failed.rank, describeFailure(failed),
                     plan.attempt + 1, plan.maxRestarts);
        plan = restartPlan(plan);
        continue;
      }
      spdlog::warn("not restarting the group: the launcher received {}", signalName(signal));
    }
    const size_t stopped = static_cast<size_t>(std::count_if(
        report.ranks.begin(), report.ranks.end(), [](const RankReport& rank) { return rank.stoppedByLauncher; }));
    const std::string others = stopped == 0 ? "" : "; stopped the other " + workers(stopped);
    const std::string restarts =
        plan.maxRestarts == 0 ? "" : " (after " + std::to_string(plan.attempt) + " of " +
                                         std::to_string(plan.maxRestarts) + " restarts)";
    spdlog::error("rank {} (pid {}) {}{}{}", failed.rank, failed.pid, describeFailure(failed), others, restarts);
    for (const std::string& line : formatFailureSummary(report)) spdlog::error("{}", line);
    return failed.status.shellCode();
  }
}

}  // namespace ddp::launcher
