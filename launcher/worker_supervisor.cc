// runAttempt: one attempt's workers started, watched (exits, signals, a stop request, a hang) and
// stopped; the state machine's class in supervisor_state.h, the early-exit judgement in
// early_exit.cc.
#include "launcher/worker_supervisor.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/no_follow.h"
#include "common/flight_recorder.h"
#include "launcher/error_file.h"
#include "launcher/exit_status.h"
#include "launcher/failure_summary.h"
#include "launcher/hang_report.h"
#include "launcher/output_relay.h"
#include "launcher/shm_cleanup.h"
#include "launcher/signal_watch.h"
#include "launcher/supervisor_state.h"
#include "launcher/worker_process.h"

namespace ddp::launcher {
namespace supervision {

WorkerSupervisor::WorkerSupervisor(SignalWatch& signals, double shutdownGraceS,
                                   std::optional<double> earlyExitGraceS, std::function<bool()> stopRequested,
                                   std::function<void(int)> onSignal)
    : signals_(signals), grace_(shutdownGraceS), stopRequested_(std::move(stopRequested)),
      onSignal_(std::move(onSignal)) {
  if (earlyExitGraceS) earlyExitGrace_ = std::chrono::duration<double>(*earlyExitGraceS);
}

WorkerSupervisor::~WorkerSupervisor() {
  if (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.reaped; })) {
    killAll();
    reapAll();
  }
  for (Worker& worker : workers_) {
    if (worker.ring) ::munmap(worker.ring, flight::ringBytes(flight::kDefaultCapacity));
    if (worker.ringFd >= 0) ::close(worker.ringFd);
  }
}

void WorkerSupervisor::reportHangOnce(bool stallOnly) {
  if (hangReported_) return;
  std::vector<RankRing> rings;
  for (const Worker& worker : workers_) {
    RankRing ring;
    ring.rank = worker.rank;
    ring.pid = worker.pid;
    ring.exited = worker.exited;
    ring.stopped = !worker.exited && processStopped(worker.pid);
    if (worker.exited) ring.exit = worker.status.signaled ? "killed by " + worker.status.describe() : worker.status.describe();
    if (worker.ring) ring.ring = flight::readRing(worker.ring, flight::ringBytes(flight::kDefaultCapacity));
    rings.push_back(std::move(ring));
  }
  try {
    hangReported_ = reportHang(rings, stallOnly, awakeSinceNs_);
  } catch (const std::exception& e) {
    spdlog::warn("could not write the hang report: {}", e.what());
    hangReported_ = true;
  }
  // A rank seen stopped is left to whoever stopped it; reportHang stops again one its stack tool
  // attached to. (Stopped again at every look, a SIGCONT that came between the look and the kill,
  // from Slurm's scontrol resume or a user's kill -CONT, was undone: the rank stayed stopped.)
}

// The worker's flight-recorder ring: a memfd (no name in any file system, so nothing outside this
// launcher and its worker can open it), formatted here, mapped read-only by the launcher. -1 where
// the kernel has no memfd: the worker then records in its own memory.
int makeRing() {
  const int fd = ::memfd_create("ddp-flight-recorder", MFD_CLOEXEC);
  if (fd < 0) return -1;
  const size_t bytes = flight::ringBytes(flight::kDefaultCapacity);
  void* memory = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (memory == MAP_FAILED) {
    ::close(fd);
    return -1;
  }
  flight::formatRing(memory, flight::kDefaultCapacity);
  ::munmap(memory, bytes);
  return fd;
}

void WorkerSupervisor::start(int rank, const WorkerCommand& given, OutputRelay& relay) {
  WorkerCommand command = given;
  Worker worker;
  worker.rank = rank;
  worker.ringFd = makeRing();
  if (worker.ringFd >= 0) {
    command.recorderFd = worker.ringFd;
    command.env[flight::kFdEnv] = std::to_string(worker.ringFd);
    void* memory = ::mmap(nullptr, flight::ringBytes(flight::kDefaultCapacity), PROT_READ, MAP_SHARED, worker.ringFd, 0);
    worker.ring = memory == MAP_FAILED ? nullptr : memory;
  }
  StartedWorker started;
  try {
    started = startWorker(command);
  } catch (...) {
    if (worker.ring) ::munmap(worker.ring, flight::ringBytes(flight::kDefaultCapacity));
    if (worker.ringFd >= 0) ::close(worker.ringFd);
    throw;
  }
  worker.pid = started.pid;
  workers_.push_back(worker);
  spdlog::debug("started rank {} as pid {}: {}", rank, started.pid, command.path);
  relay.add(started.stdoutFd, rank, false);
  relay.add(started.stderrFd, rank, true);
}

// Looks come at most a poll interval apart: one far later, and the launcher was stopped (with its
// job, as Slurm's scontrol suspend stops every process of it) until now.
void WorkerSupervisor::noteWakeUp() {
  const auto look = Clock::now();
  if (look - lastLook_ > kPollInterval + std::chrono::seconds(1)) awakeSinceNs_ = flight::nowNs();
  lastLook_ = look;
}

AttemptReport WorkerSupervisor::monitor() {
  while (true) {
    pollExits();
    if (running() == 0) break;
    noteWakeUp();
    // A collective that runs well past its group's timeout without the rank failing (a backend whose
    // own timeout did not fire): report once, and let the job run on.
    if (!stopping_ && !hangReported_) reportHangOnce(/*stallOnly=*/true);
    if (!stopping_ && stopRequested_ && stopRequested_()) {
      // A worker that died before the request came is this node's own failure, not a consequence
      // of the stop: often its death is what made another node end the round (a rank killed from
      // outside; its peers' connections reset). Reaped first, it is reported as such.
      pollExits();
      if (!stopping_) {
        stoppedOnRequest_ = true;
        beginStop(SIGTERM);  // our worker finishes its step, checkpoints and exits, as on preemption
      }
    }
    auto timeout = checkEarlyExit(stopRequested_ ? kRequestPollInterval : kPollInterval);
    if (stopping_ && !killed_) {
      const auto now = Clock::now();
      if (now >= killAt_) {
        bool anyKilled = false;
        for (const Worker& worker : workers_) {
          if (worker.exited) continue;
          anyKilled = true;
          spdlog::warn("rank {} (pid {}) still running {} s after {}; sending SIGKILL", worker.rank, worker.pid,
                       grace_.count(), signalName(launcherSignal_ != 0 ? launcherSignal_ : SIGTERM));
        }
        if (anyKilled && (launcherSignal_ != 0 || stoppedOnRequest_)) {  // a stop the workers could have saved
          spdlog::warn("what those workers did since their last checkpoint is lost; if they checkpoint on a signal "
                       "and need longer for it (a slow step, a large model to write), give them more time with "
                       "--shutdown_grace_s (torchrun's default is 30 s)");
        }
        killAll();
        continue;
      }
      timeout = std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(killAt_ - now));
    }
    const int signal = signals_.wait(timeout);
    if (signal == SIGTSTP) {
      suspendWithWorkers();
      continue;
    }
    if (signal == 0 || !signals_.isForwarded(signal)) continue;  // SIGCHLD or timeout: poll again
    if (!stopping_) {
      spdlog::warn("received {}; forwarding it to {} (SIGKILL after {} s)", signalName(signal),
                   workers(running()), grace_.count());
      launcherSignal_ = signal;
      if (onSignal_) onSignal_(signal);
      beginStop(signal);
      signalAt_ = Clock::now();  // after onSignal_'s store calls (elastic), which may take a while
    } else if (!killed_ && !copyNoted_ && signal == launcherSignal_ && Clock::now() - signalAt_ < kSameRequest) {
      // `timeout` or a script that forwards it, and a signal to the whole process group (kill -- -PGID,
      // a scheduler), deliver one request twice: a SIGKILL now would lose the checkpoint it asks for.
      spdlog::warn("received {} again within {} ms: taken as a copy of the same request (a wrapper and the "
                   "process group both signalled); send it once more to skip the grace period",
                   signalName(signal), std::chrono::duration_cast<std::chrono::milliseconds>(kSameRequest).count());
      copyNoted_ = true;
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
  // Before reaping: the zombies keep the pids ours, so no other process's segment matches.
  std::vector<pid_t> pids;
  for (const Worker& worker : workers_) pids.push_back(worker.pid);
  for (const std::string& name : removeShmSegments(pids)) {
    spdlog::warn("removed the shared-memory segment /dev/shm/{} that a stopped worker left", name);
  }
  reapAll();

  AttemptReport report;
  report.firstFailure = firstFailure_;
  report.launcherSignal = launcherSignal_;
  report.failedWhileStopping = failedWhileStopping_;
  report.stoppedOnRequest = stoppedOnRequest_;
  report.shutdownGraceS = grace_.count();
  report.earlyExitGraceS = earlyExitGrace_ ? earlyExitGrace_->count() : 0;
  for (const Worker& worker : workers_) {
    RankReport rank;
    rank.rank = worker.rank;
    rank.pid = worker.pid;
    rank.status = worker.status;
    rank.stoppedByLauncher = worker.stoppedByLauncher;
    rank.killedByLauncher = worker.killedByLauncher;
    rank.leftEarly = worker.leftEarly;
    rank.stoppedBySignal = worker.stoppedBySignal;
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
  // Exits after a stop began are its consequence, not news, unless a worker that was asked to
  // stop by a forwarded signal fails at it (e.g. its preemption checkpoint hit a full disk).
  if (stopping_) {
    if (launcherSignal_ != 0 && !firstFailure_ && !endedBySignalAsAsked(worker)) {
      firstFailure_ = static_cast<size_t>(&worker - workers_.data());
      failedWhileStopping_ = true;
      spdlog::error("rank {} (pid {}) {} while stopping on {}; what it was saving may be incomplete", worker.rank,
                    worker.pid, worker.status.signaled ? "was killed by " + worker.status.describe()
                                                       : "failed with " + worker.status.describe(),
                    signalName(launcherSignal_));
    }
    return;
  }
  const size_t index = static_cast<size_t>(&worker - workers_.data());
  if (worker.status.success()) {
    if (!firstCleanExit_) {
      firstCleanExit_ = index;
      firstCleanExitAt_ = Clock::now();
      // The others' CPU time from here on tells working from waiting (lookAtRunningRanks).
      std::vector<pid_t> running;
      for (const Worker& other : workers_) {
        if (!other.exited) running.push_back(other.pid);
      }
      const std::map<pid_t, long long> ticks = treeCpuTicks(running);
      for (Worker& other : workers_) {
        if (!other.exited && ticks.count(other.pid)) other.cpuTicks = other.cpuTicksBefore = ticks.at(other.pid);
      }
    }
    return;
  }
  if (firstCleanExit_ && running() > 0) {
    // Often the consequence: the others noticed their peer was gone.
    const Worker& left = workers_[*firstCleanExit_];
    spdlog::warn("rank {} (pid {}) had exited with code 0 {:.1f} s before rank {} failed, while other ranks still ran",
                 left.rank, left.pid, std::chrono::duration<double>(Clock::now() - firstCleanExitAt_).count(),
                 worker.rank);
  }
  fail(index);
}

bool WorkerSupervisor::endedBySignalAsAsked(const Worker& worker) const {
  const ExitStatus& status = worker.status;
  if (status.signaled) return status.signal == launcherSignal_ || status.signal == SIGKILL;
  return status.code == 0 || status.code == 128 + launcherSignal_;
}

void WorkerSupervisor::fail(size_t index) {
  firstFailure_ = index;
  // Before SIGTERM (a stopped rank stays stopped, state T, with it pending, until SIGKILL) and before
  // the hang report's stack tool attaches to it (its detach may resume the rank for a moment).
  for (Worker& worker : workers_) worker.stoppedBySignal = !worker.exited && processStopped(worker.pid);
  // Before anything is stopped: the rings and stacks as the failure found them.
  reportHangOnce(false);
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

// Ctrl-Z. The workers run in process groups of their own (a terminal's Ctrl-C reaches the launcher
// alone, which stops them in order), so the terminal's SIGTSTP stopped only the launcher: its
// workers ran on, filled the output pipes nobody drained, blocked, and the other ranks timed out
// in their collectives (torchrun's workers share its group and stop with it). They stop with the
// launcher now, and continue with it (fg, SIGCONT).
void WorkerSupervisor::suspendWithWorkers() {
  for (const Worker& worker : workers_) {
    if (!worker.reaped) ::kill(-worker.pid, SIGSTOP);
  }
  const auto stoppedAt = Clock::now();
  SignalWatch::suspendedOn(SIGTSTP);
  for (const Worker& worker : workers_) {
    if (!worker.reaped) ::kill(-worker.pid, SIGCONT);
  }
  // The clock ran on while everything was stopped: a grace period (the SIGTERM's checkpoint) starts
  // over where it was, not spent.
  if (stopping_) killAt_ += Clock::now() - stoppedAt;
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

}  // namespace supervision

namespace {

// Opens rank `rank`'s log file for this attempt, creating attempt_<K>/ when the layout has one.
int openRankLog(const LaunchPlan& plan, int rank) {
  const std::string path = rankLogPath(plan, rank);
  const std::string dir = path.substr(0, path.rfind('/'));
  if (dir != plan.logDir && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    DDP_THROW(ConfigError, "--log_dir: cannot create '", dir, "' (", std::strerror(errno), ")");
  }
  const int fd = openForWriting(path, /*append=*/false);
  if (fd < 0) DDP_THROW(ConfigError, "--log_dir: cannot write '", path, "': ", openFailure(errno));
  return fd;
}

}  // namespace

AttemptReport runAttempt(const LaunchPlan& plan, const SupervisionOptions& options, SignalWatch& signals) {
  OutputRelayOptions relayOptions;
  relayOptions.console = plan.outputToConsole();
  // Declared before the supervisor so it outlives it: the final drain comes after reaping.
  OutputRelay relay(relayOptions);
  if (!plan.logDir.empty()) {
    for (int rank : plan.ranks) relay.addLogFile(rank, openRankLog(plan, rank));
  }
  if (!plan.consoleRanks.empty()) {
    for (int rank : plan.ranks) {
      if (std::find(plan.consoleRanks.begin(), plan.consoleRanks.end(), rank) == plan.consoleRanks.end()) {
        relay.hideFromConsole(rank);
      }
    }
  }
  // Each worker's TORCHELASTIC_ERROR_FILE, as torchrun gives it (a @record Python worker writes its
  // exception there); read for the failure summary before the directory goes.
  for (const std::string& name : removeOrphanedShmSegments()) {
    spdlog::info("removed /dev/shm/{}, a shared-memory segment a killed job left at its start", name);
  }
  const ErrorFiles errorFiles;
  supervision::WorkerSupervisor supervisor(signals, plan.shutdownGraceS, options.earlyExitGraceS, options.stopRequested,
                              options.onSignal);
  for (size_t i = 0; i < plan.commands.size(); ++i) {
    WorkerCommand command = plan.commands[i];
    const std::string errorFile = errorFiles.pathFor(plan.ranks[i]);
    if (!errorFile.empty()) command.env["TORCHELASTIC_ERROR_FILE"] = errorFile;
    supervisor.start(plan.ranks[i], command, relay);
  }
  relay.start();
  AttemptReport report = supervisor.monitor();
  for (RankReport& rank : report.ranks) {
    if (!rank.status.success()) rank.errorFile = readErrorFile(errorFiles.pathFor(rank.rank));
  }
  // Stopped by a signal: a console nobody reads (a full stdout pipe) may not keep the launcher from
  // ending; the rank logs still get every line.
  relay.finish(report.launcherSignal != 0 ? std::chrono::milliseconds(2000) : std::chrono::milliseconds::max());
  for (RankReport& rank : report.ranks) rank.lastLines = relay.lastLines(rank.rank);
  return report;
}

}  // namespace ddp::launcher
