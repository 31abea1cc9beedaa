#include "launcher/worker_supervisor.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
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
#include "launcher/worker_process.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Upper bound on one wait, though SIGCHLD normally wakes the loop at once.
constexpr std::chrono::milliseconds kPollInterval{1000};
// How often SupervisionOptions::stopRequested is asked.
constexpr std::chrono::milliseconds kRequestPollInterval{100};
// A repeat of the signal that began the stop within this long is one request delivered twice (the
// worker's window is 2 s, as the launcher's forwarded copy may lag); one such copy is absorbed.
constexpr std::chrono::milliseconds kSameRequest{1000};

std::string workers(size_t count) { return std::to_string(count) + (count == 1 ? " worker" : " workers"); }

// What /proc/<pid>/stat says of a process: its state letter and its CPU time.
struct ProcStat {
  char state = '?';         // 'R', 'S', 'D' (disk wait), 'T'/'t' (stopped), ...; '?' unreadable
  long long cpuTicks = 0;   // utime + stime over all its threads, in clock ticks
};

ProcStat procStat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  ProcStat stat;
  const size_t close = line.rfind(')');  // "pid (comm) S ...": the fields follow the last ')'
  if (close == std::string::npos || close + 2 >= line.size()) return stat;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // field 3 is the state; 14 utime, 15 stime
    if (i == 3) stat.state = field.front();
    if (i == 14) utime = std::atoll(field.c_str());
    if (i == 15) stime = std::atoll(field.c_str());
  }
  stat.cpuTicks = utime + stime;
  return stat;
}

// Stopped by a signal or a debugger (state T or t), so not answering.
bool processStopped(pid_t pid) {
  const char state = procStat(pid).state;
  return state == 'T' || state == 't';
}

// How often the ranks left running are looked at again after an early exit that found them working.
constexpr std::chrono::milliseconds kEarlyExitRecheck{1000};
// More CPU time than this since the last look (ticks of 10 ms): working, not waiting.
constexpr long long kBusyTicks = 2;
// A collective running this long is waited in, not passing through.
constexpr int64_t kBlockedAfterNs = 1000000000;

// The state machine behind runWorkers(), one instance per launch.
class WorkerSupervisor {
 public:
  WorkerSupervisor(SignalWatch& signals, double shutdownGraceS, std::optional<double> earlyExitGraceS,
                   std::function<bool()> stopRequested = {}, std::function<void(int)> onSignal = {});
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
    bool leftEarly = false;          // exited 0, and others ran on past the early-exit grace
    bool stoppedBySignal = false;    // in state T when the first failure came
    ExitStatus status;
    long long cpuTicks = 0;          // user + system CPU time at the last look (lookAtRunningRanks)
    int ringFd = -1;                 // the flight recorder's memfd, kept after the worker exits
    void* ring = nullptr;            // mapped read-only here
  };

  // Reads every worker's flight recorder and reports a hang or unpaired collectives (once).
  void reportHangOnce(bool stallOnly);
  bool hangReported_ = false;

  // Records exits of workers that have ended, without reaping them.
  void pollExits();
  void onExit(Worker& worker);
  // A rank exited 0 while others still run: past the grace this is an early exit, a failure.
  // Returns how long the loop may wait before the grace ends.
  std::chrono::milliseconds checkEarlyExit(std::chrono::milliseconds timeout);
  // The ranks still running after an early exit: in a collective for a while ("blocked"), working
  // (outside any recorded collective, or using CPU), or idle (no recorder and no CPU time).
  struct RunningRanks {
    std::string blocked, working, idle;  // rank lists
    std::string collective;              // what a blocked rank waits in
  };
  RunningRanks lookAtRunningRanks();
  bool toldWaiting_ = false;
  void fail(size_t index);
  // Exited 0 or 128 + the forwarded signal, or was ended by that signal or the launcher's SIGKILL.
  bool endedBySignalAsAsked(const Worker& worker) const;
  void beginStop(int signal);
  void killAll();
  void reapAll();
  size_t running() const;

  SignalWatch& signals_;
  std::chrono::duration<double> grace_;
  std::optional<std::chrono::duration<double>> earlyExitGrace_;
  std::vector<Worker> workers_;
  std::optional<size_t> firstCleanExit_;  // index of the first worker that exited 0
  Clock::time_point firstCleanExitAt_;
  std::optional<size_t> firstFailure_;  // index into workers_
  int launcherSignal_ = 0;              // forwarded signal that started the stop, if any
  Clock::time_point signalAt_;          // when it came
  bool copyNoted_ = false;              // one copy of it within kSameRequest was absorbed
  bool failedWhileStopping_ = false;    // firstFailure_ came during a signal's stop
  bool stopping_ = false;
  bool killed_ = false;                 // SIGKILL sent to every group
  std::function<bool()> stopRequested_;
  std::function<void(int)> onSignal_;
  bool stoppedOnRequest_ = false;       // stopRequested_ said so: SIGTERM to all, not a failure
  Clock::time_point killAt_;
};

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
    hangReported_ = reportHang(rings, stallOnly);
  } catch (const std::exception& e) {
    spdlog::warn("could not write the hang report: {}", e.what());
    hangReported_ = true;
  }
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

AttemptReport WorkerSupervisor::monitor() {
  while (true) {
    pollExits();
    if (running() == 0) break;
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
      for (Worker& other : workers_) {
        if (!other.exited) other.cpuTicks = procStat(other.pid).cpuTicks;
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

std::chrono::milliseconds WorkerSupervisor::checkEarlyExit(std::chrono::milliseconds timeout) {
  if (stopping_ || !firstCleanExit_ || !earlyExitGrace_ || running() == 0) return timeout;
  const auto deadline = firstCleanExitAt_ + std::chrono::duration_cast<Clock::duration>(*earlyExitGrace_);
  const auto now = Clock::now();
  if (now < deadline) return std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
  Worker& left = workers_[*firstCleanExit_];
  // Past the grace: the ranks still running are waiting for the one that left only if they are
  // in a collective (their flight recorder says so), or, without one, if they do nothing at all.
  // A rank that works (saves, evaluates) is let finish however long it takes, as torchrun does.
  const RunningRanks seen = lookAtRunningRanks();
  if (seen.blocked.empty() && !seen.working.empty()) {
    if (!toldWaiting_) {
      spdlog::info("rank {} exited with code 0 {:.0f} s ago; rank(s) {} still work outside any collective "
                   "(e.g. saving): waiting for them",
                   left.rank, std::chrono::duration<double>(now - firstCleanExitAt_).count(), seen.working);
      toldWaiting_ = true;
    }
    return std::min(timeout, kEarlyExitRecheck);
  }
  left.leftEarly = true;
  const double after = std::chrono::duration<double>(now - firstCleanExitAt_).count();
  if (!seen.blocked.empty()) {
    spdlog::warn("rank {} (pid {}) exited with code 0 {:.0f} s ago while rank(s) {} wait in a collective it never "
                 "entered ({}); stopping the job", left.rank, left.pid, after, seen.blocked, seen.collective);
  } else {
    spdlog::warn("rank {} (pid {}) exited with code 0 {:.0f} s ago and rank(s) {} show no sign of life since (no "
                 "CPU time, no collective); stopping the job", left.rank, left.pid, after, seen.idle);
  }
  fail(*firstCleanExit_);
  return std::chrono::milliseconds(0);
}

WorkerSupervisor::RunningRanks WorkerSupervisor::lookAtRunningRanks() {
  RunningRanks seen;
  const int64_t nowNs = flight::nowNs();
  auto add = [](std::string& list, int rank) { list += (list.empty() ? "" : ", ") + std::to_string(rank); };
  for (Worker& worker : workers_) {
    if (worker.exited) continue;
    // Using CPU time, or waiting for the disk (state D: a large save): working.
    const ProcStat stat = procStat(worker.pid);
    const bool busy = stat.cpuTicks > worker.cpuTicks + kBusyTicks || stat.state == 'D';
    worker.cpuTicks = stat.cpuTicks;
    std::optional<flight::Record> waiting;
    bool recorded = false;
    if (worker.ring) {
      const flight::Snapshot ring = flight::readRing(worker.ring, flight::ringBytes(flight::kDefaultCapacity));
      recorded = ring.valid;
      for (const flight::Record& r : ring.records) {
        // In it for a second at least: a collective among the others alone passes in less.
        if (r.state == flight::State::kRunning && nowNs - r.startNs > kBlockedAfterNs) waiting = r;
      }
    }
    if (waiting) {
      add(seen.blocked, worker.rank);
      seen.collective = waiting->op + " #" + std::to_string(waiting->seq) +
                        (waiting->label.empty() ? "" : " (" + waiting->label + ")");
    } else if (recorded || busy) {
      add(seen.working, worker.rank);  // a recorder that shows no collective: working, whatever the CPU says
    } else {
      add(seen.idle, worker.rank);
    }
  }
  return seen;
}

bool WorkerSupervisor::endedBySignalAsAsked(const Worker& worker) const {
  const ExitStatus& status = worker.status;
  if (status.signaled) return status.signal == launcherSignal_ || status.signal == SIGKILL;
  return status.code == 0 || status.code == 128 + launcherSignal_;
}

void WorkerSupervisor::fail(size_t index) {
  firstFailure_ = index;
  // Before anything is stopped: the rings and stacks as the failure found them.
  reportHangOnce(false);
  // Before SIGTERM: a stopped rank stays stopped (state T) with it pending, until SIGKILL.
  for (Worker& worker : workers_) worker.stoppedBySignal = !worker.exited && processStopped(worker.pid);
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
  const ErrorFiles errorFiles;
  WorkerSupervisor supervisor(signals, plan.shutdownGraceS, options.earlyExitGraceS, options.stopRequested,
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
