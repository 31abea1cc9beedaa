// Starting this node's workers, watching them and stopping them all together.
#pragma once

#include "launcher/launch_plan.h"

namespace ddp::launcher {

/// Runs `plan` to the end and returns the launcher's exit code: 0 when every worker
/// succeeds; the first failed worker's exit code (128 + signal if it was killed) after
/// stopping the others, with a summary of every rank on stderr; 128 + signal when the
/// launcher itself got SIGINT/SIGTERM/SIGHUP/SIGQUIT, which it forwards to every worker.
/// Stopping = the signal (SIGTERM for a failure) to each worker's process group, SIGKILL
/// after plan.shutdownGraceS. A failure with restarts left (plan.maxRestarts) stops the
/// group and starts it again from restartPlan(), unless the launcher got a signal.
/// Every worker is reaped on every path, exceptions included.
int runWorkers(const LaunchPlan& plan);

}  // namespace ddp::launcher
