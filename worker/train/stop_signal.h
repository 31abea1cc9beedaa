// SIGTERM/SIGINT/SIGHUP as a request to stop after the current step (and save
// a checkpoint) instead of dying mid-step: preemption-safe training.
#pragma once

namespace ddp::worker {

/// Installs the handlers (idempotent). A second signal of the same kind
/// restores the default action and re-raises, so a stuck worker still dies.
void installStopSignalHandlers();

/// The signal number received, or 0.
int stopSignal();

}  // namespace ddp::worker
