// The restart policy around runAttempt(): how the launcher ends a job, or starts its group again
// after a failure (torchrun's --max_restarts), with a back-off a forwarded signal cuts short.
#include <algorithm>
#include <chrono>
#include <string>

#include <spdlog/spdlog.h>

#include "launcher/exit_status.h"
#include "launcher/failure_summary.h"
#include "launcher/signal_watch.h"
#include "launcher/worker_supervisor.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

std::string workers(size_t count) { return std::to_string(count) + (count == 1 ? " worker" : " workers"); }

}  // namespace

namespace {

// A forwarded signal that arrived after the attempt's monitor returned, or 0.
int pendingSignal(SignalWatch& signals) {
  while (const int signal = signals.wait(std::chrono::milliseconds(0))) {
    if (SignalWatch::suspendedOn(signal)) continue;
    if (signals.isForwarded(signal)) return signal;
  }
  return 0;
}

// Waits `seconds` before a restart; returns a forwarded signal that cut it short, or 0.
int waitBeforeRestart(SignalWatch& signals, double seconds, int restart, int maxRestarts) {
  spdlog::warn("restart {}/{} in {} s (back-off doubles after each restart)", restart, maxRestarts, seconds);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (auto now = Clock::now(); now < deadline; now = Clock::now()) {
    const int signal = signals.wait(std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
    if (SignalWatch::suspendedOn(signal)) continue;
    if (signal != 0 && signals.isForwarded(signal)) return signal;
  }
  return 0;
}

}  // namespace

double restartBackoffSeconds(const SupervisionOptions& options, int restart) {
  double seconds = options.restartBackoffS;
  for (int i = 1; i < restart && seconds < options.restartBackoffMaxS; ++i) seconds *= 2;
  return std::min(seconds, options.restartBackoffMaxS);
}

int runWorkers(const LaunchPlan& initialPlan, const SupervisionOptions& options) {
  SignalWatch signals;
  LaunchPlan plan = initialPlan;
  while (true) {
    spdlog::debug("attempt {}: MASTER_PORT={}", plan.attempt, plan.masterPort);
    const AttemptReport report = runAttempt(plan, options, signals);
    if (!report.firstFailure) return report.launcherSignal != 0 ? 128 + report.launcherSignal : 0;

    const RankReport& failed = report.ranks[*report.firstFailure];
    int signal = report.launcherSignal != 0 ? report.launcherSignal : pendingSignal(signals);
    const bool configError = !failed.status.signaled && failed.status.code == kWorkerConfigErrorCode;
    if (plan.attempt < plan.maxRestarts) {
      if (signal == 0 && configError) {
        spdlog::warn("not restarting the group: rank {} exited with code {} (bad configuration), which every "
                     "restart would repeat", failed.rank, kWorkerConfigErrorCode);
      } else if (signal == 0) {
        spdlog::warn("rank {} {}; restarting the group (restart {}/{})", failed.rank, describeFailure(failed),
                     plan.attempt + 1, plan.maxRestarts);
        signal = waitBeforeRestart(signals, restartBackoffSeconds(options, plan.attempt + 1), plan.attempt + 1,
                                   plan.maxRestarts);
        if (signal == 0) {
          plan = restartPlan(plan);
          continue;
        }
      }
      if (signal != 0) spdlog::warn("not restarting the group: the launcher received {}", signalName(signal));
    }
    const size_t stopped = static_cast<size_t>(std::count_if(
        report.ranks.begin(), report.ranks.end(), [](const RankReport& rank) { return rank.stoppedByLauncher; }));
    const std::string others =
        report.failedWhileStopping ? " while the job stopped on " + signalName(report.launcherSignal)
        : stopped == 0             ? ""
                                   : "; stopped the other " + workers(stopped);
    const std::string restarts =
        plan.maxRestarts == 0 ? "" : " (after " + std::to_string(plan.attempt) + " of " +
                                         std::to_string(plan.maxRestarts) + " restarts)";
    spdlog::error("rank {} (pid {}) {}{}{}", failed.rank, failed.pid, describeFailure(failed), others, restarts);
    for (const std::string& line : formatFailureSummary(report)) spdlog::error("{}", line);
    return failed.leftEarly ? kEarlyExitCode : failed.status.shellCode();
  }
}

}  // namespace ddp::launcher
