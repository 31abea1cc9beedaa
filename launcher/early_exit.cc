// A rank that exited 0 while the others still run: past the early-exit grace, whether the others
// wait for it (in a collective, or idle) or still work (saving, evaluating), from their flight
// recorders and /proc/<pid>/stat.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <vector>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include <spdlog/spdlog.h>

#include "common/flight_recorder.h"
#include "launcher/supervisor_state.h"

namespace ddp::launcher::supervision {

ProcStat procStat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  ProcStat stat;
  const size_t close = line.rfind(')');  // "pid (comm) S ...": the fields follow the last ')'
  if (close == std::string::npos || close + 2 >= line.size()) return stat;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  long long utime = 0, stime = 0, cutime = 0, cstime = 0;
  for (int i = 3; i <= 17 && fields >> field; ++i) {  // 3 state, 4 ppid; 14 utime, 15 stime, 16 cutime, 17 cstime
    if (i == 3) stat.state = field.front();
    if (i == 4) stat.ppid = static_cast<pid_t>(std::atoll(field.c_str()));
    if (i == 14) utime = std::atoll(field.c_str());
    if (i == 15) stime = std::atoll(field.c_str());
    if (i == 16) cutime = std::atoll(field.c_str());
    if (i == 17) cstime = std::atoll(field.c_str());
  }
  stat.cpuTicks = utime + stime;
  stat.reapedTicks = cutime + cstime;
  return stat;
}

std::map<pid_t, long long> treeCpuTicks(const std::vector<pid_t>& roots) {
  std::map<pid_t, ProcStat> all;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    const auto pid = static_cast<pid_t>(std::atoll(name.c_str()));
    const ProcStat stat = procStat(pid);
    if (stat.state != '?') all.emplace(pid, stat);
  }
  std::map<pid_t, long long> out;
  for (pid_t root : roots) {
    long long ticks = 0;
    for (const auto& [pid, stat] : all) {
      // pid is in root's tree when root is among its ancestors (or it is root).
      pid_t p = pid;
      for (int depth = 0; p > 1 && p != root && depth < 64; ++depth) {
        const auto it = all.find(p);
        p = it == all.end() ? 0 : it->second.ppid;
      }
      if (p == root) ticks += stat.cpuTicks + stat.reapedTicks;
    }
    out[root] = ticks;
  }
  return out;
}

bool processStopped(pid_t pid) {
  const char state = procStat(pid).state;
  return state == 'T' || state == 't';
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
    spdlog::warn("rank {} (pid {}) exited with code 0 {:.0f} s ago and rank(s) {} have shown no sign of life for {:.0f} s "
                 "(no CPU time, no collective); stopping the job", left.rank, left.pid, after, seen.idle,
                 earlyExitGrace_->count());
  }
  fail(*firstCleanExit_);
  return std::chrono::milliseconds(0);
}

WorkerSupervisor::RunningRanks WorkerSupervisor::lookAtRunningRanks() {
  RunningRanks seen;
  const int64_t nowNs = flight::nowNs();
  auto add = [](std::string& list, int rank) { list += (list.empty() ? "" : ", ") + std::to_string(rank); };
  std::vector<pid_t> running;
  for (const Worker& worker : workers_) {
    if (!worker.exited) running.push_back(worker.pid);
  }
  const std::map<pid_t, long long> ticks = treeCpuTicks(running);
  for (Worker& worker : workers_) {
    if (worker.exited) continue;
    // Using CPU time (itself or a child it runs), or waiting for the disk (state D: a large save): working.
    const ProcStat stat = procStat(worker.pid);
    const long long now = ticks.count(worker.pid) ? ticks.at(worker.pid) : stat.cpuTicks;
    // CPU time over the last two looks (the first: since the early exit), so a burst cut by a look
    // still counts; a hung rank's watchdog threads (a tick now and then) stay below it.
    const bool busyNow = now > worker.cpuTicksBefore + kBusyTicks || stat.state == 'D';
    worker.cpuTicksBefore = worker.cpuTicks;
    worker.cpuTicks = now;
    const auto at = std::chrono::steady_clock::now();
    if (busyNow) worker.lastBusyAt = at;
    // Idle since the last look, but busy within a grace: between two bursts of its work.
    const bool busy = busyNow || (worker.lastBusyAt && earlyExitGrace_ && at - *worker.lastBusyAt < *earlyExitGrace_);
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

}  // namespace ddp::launcher::supervision
