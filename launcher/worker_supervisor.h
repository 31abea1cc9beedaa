// Starting this node's workers, watching them and stopping them all together.
#pragma once

#include <functional>
#include <optional>

#include "launcher/launch_plan.h"

namespace ddp::launcher {

/// Exit code of the launcher when a rank exited 0 but left the others running (see
/// SupervisionOptions::earlyExitGraceS): the job did not finish.
constexpr int kEarlyExitCode = 1;
/// A worker's exit code for bad configuration (the worker's ConfigError): never restarted,
/// since every attempt would fail the same way.
constexpr int kWorkerConfigErrorCode = 2;

/// How the launcher watches one job, beyond what the plan says.
struct SupervisionOptions {
  // --early_exit_grace_s: a rank that exits 0 while others still run this much later left
  // early (our worker's ranks leave together after a final barrier); nullopt = never.
  std::optional<double> earlyExitGraceS = 30.0;
  double restartBackoffS = 1.0;     // wait before the first restart, doubled for each next one
  double restartBackoffMaxS = 30.0; // cap of that wait
  // Asked every kRequestPollInterval while the workers run (elastic jobs: another node left or
  // wants to join): true stops them as a forwarded SIGTERM would, without counting as a failure.
  std::function<bool()> stopRequested;
  // Called with a forwarded signal when it starts stopping the workers (elastic jobs: tell the
  // other nodes that this one leaves, before its workers are gone).
  std::function<void(int)> onSignal;
};

/// The wait before restart number `restart` (1 for the first): restartBackoffS doubled for each
/// restart before it, capped at restartBackoffMaxS.
double restartBackoffSeconds(const SupervisionOptions& options, int restart);

/// Runs `plan` to the end and returns the launcher's exit code: 0 when every worker
/// succeeds; the first failed worker's exit code (128 + signal if it was killed) after
/// stopping the others, with a summary of every rank on stderr; 128 + signal when the
/// launcher itself got SIGINT/SIGTERM/SIGHUP/SIGQUIT, which it forwards to every worker.
/// Stopping = the signal (SIGTERM for a failure) to each worker's process group, SIGKILL
/// after plan.shutdownGraceS. A failure with restarts left (plan.maxRestarts) stops the
/// group and starts it again from restartPlan(), unless the launcher got a signal.
/// Every worker is reaped on every path, exceptions included. A worker that exits with
/// kWorkerConfigErrorCode is never restarted; other restarts wait options.restartBackoffS,
/// doubling up to options.restartBackoffMaxS (a forwarded signal cuts the wait and ends the job).
/// A rank that exits 0 while others run on past options.earlyExitGraceS stops the job with
/// kEarlyExitCode. After each attempt, shared-memory segments the workers left are removed.
int runWorkers(const LaunchPlan& plan, const SupervisionOptions& options = {});

class SignalWatch;
struct AttemptReport;

/// One run of the whole group of `plan`, from start to the last worker reaped (output relayed,
/// stopped together on a failure, a forwarded signal or options.stopRequested).
AttemptReport runAttempt(const LaunchPlan& plan, const SupervisionOptions& options, SignalWatch& signals);

}  // namespace ddp::launcher
