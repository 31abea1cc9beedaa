// The launcher's supervision of one attempt's workers (runAttempt, worker_supervisor.cc): the state
// machine's class, shared with early_exit.cc (a rank that exited 0 while others run). Internal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launcher/exit_status.h"
#include "launcher/output_relay.h"
#include "launcher/signal_watch.h"
#include "launcher/worker_process.h"
#include "launcher/worker_supervisor.h"

namespace ddp::launcher::supervision {

using Clock = std::chrono::steady_clock;

// Upper bound on one wait, though SIGCHLD normally wakes the loop at once.
constexpr std::chrono::milliseconds kPollInterval{1000};
// How often SupervisionOptions::stopRequested is asked.
constexpr std::chrono::milliseconds kRequestPollInterval{100};
// A repeat of the signal that began the stop within this long is one request delivered twice (the
// worker's window is 2 s, as the launcher's forwarded copy may lag); one such copy is absorbed.
constexpr std::chrono::milliseconds kSameRequest{1000};

inline std::string workers(size_t count) { return std::to_string(count) + (count == 1 ? " worker" : " workers"); }

// What /proc/<pid>/stat says of a process: its state letter and its CPU time.
struct ProcStat {
  char state = '?';         // 'R', 'S', 'D' (disk wait), 'T'/'t' (stopped), ...; '?' unreadable
  long long cpuTicks = 0;   // utime + stime over all its threads, in clock ticks
  long long reapedTicks = 0;  // cutime + cstime: its children's that it waited for
  pid_t ppid = 0;
};
ProcStat procStat(pid_t pid);
// The CPU time of each root's process tree, in clock ticks: its own, its reaped children's, and
// every live descendant's (a rank whose work runs in a child: an upload, an evaluation script).
// One pass over /proc.
std::map<pid_t, long long> treeCpuTicks(const std::vector<pid_t>& roots);
// Stopped by a signal or a debugger (state T or t), so not answering.
bool processStopped(pid_t pid);

// How often the ranks left running are looked at again after an early exit that found them working.
constexpr std::chrono::milliseconds kEarlyExitRecheck{1000};
// More CPU time than this over the last two looks (ticks of 10 ms): working, not waiting.
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
    long long cpuTicks = 0;          // user + system CPU time at the last look (first: at the early exit)
    long long cpuTicksBefore = 0;    // ... at the look before that
    // The last look that found it busy: a rank that works in bursts (uploads, polls, syncs) between
    // idle seconds is working until it has been idle for a whole early-exit grace.
    std::optional<std::chrono::steady_clock::time_point> lastBusyAt;
    int ringFd = -1;                 // the flight recorder's memfd, kept after the worker exits
    void* ring = nullptr;            // mapped read-only here
  };

  // Reads every worker's flight recorder and reports a hang or unpaired collectives (once).
  void reportHangOnce(bool stallOnly);
  bool hangReported_ = false;
  // The launcher's last look, and when it last woke from being stopped (flight::nowNs; 0: never):
  // a collective that started before runs from then for the stall check.
  Clock::time_point lastLook_ = Clock::now();
  int64_t awakeSinceNs_ = 0;
  void noteWakeUp();

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
  void suspendWithWorkers();
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

}  // namespace ddp::launcher::supervision
