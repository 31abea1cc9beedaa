#include "launcher/worker_supervisor.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <optional>
#include <vector>

#include <sys/wait.h>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "launcher/exit_status.h"
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
  // forwarded signal arrives; reaps them; logs the outcome; returns the exit code.
  int monitor();

 private:
  using Clock = std::chrono::steady_clock;

  struct Worker {
    int rank = 0;
    pid_t pid = -1;  // also the process-group id
    bool exited = false;  // exit seen with WNOWAIT: the zombie keeps the pid and group id ours
    bool reaped = false;
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
  size_t stoppedWorkers_ = 0;           // workers still running when the stop began
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

int WorkerSupervisor::monitor() {
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
      killAll();
    }
  }
  // Children the workers left behind in their groups; the zombies keep the group ids ours.
  if (stopping_) killAll();
  reapAll();

  if (firstFailure_) {
    const Worker& failed = workers_[*firstFailure_];
    const std::string what = failed.status.signaled ? "was killed by " : "failed with ";
    const std::string others =
        stoppedWorkers_ == 0 ? "" : "; stopped the other " + workers(stoppedWorkers_);
    spdlog::error("rank {} (pid {}) {}{}{}", failed.rank, failed.pid, what, failed.status.describe(), others);
    return failed.status.shellCode();
  }
  if (launcherSignal_ != 0) return 128 + launcherSignal_;
  return 0;
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
  stoppedWorkers_ = running();
  killAt_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace_);
  // Exited workers' groups too: their children may still run, and the zombie leader
  // guarantees the group id has not been reused.
  for (const Worker& worker : workers_) {
    if (!worker.reaped) ::kill(-worker.pid, signal);
  }
}

void WorkerSupervisor::killAll() {
  killed_ = true;
  for (const Worker& worker : workers_) {
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

int runWorkers(const LaunchPlan& plan) {
  SignalWatch signals;
  // Declared before the supervisor so it outlives it: the final drain comes after reaping.
  OutputRelay relay;
  WorkerSupervisor supervisor(signals, plan.shutdownGraceS);
  for (size_t i = 0; i < plan.commands.size(); ++i) supervisor.start(plan.ranks[i], plan.commands[i], relay);
  relay.start();
  const int code = supervisor.monitor();
  relay.finish();
  return code;
}

}  // namespace ddp::launcher
