// mode: eval — load a model file (our export, a Python state_dict with or
// without "module.", saved on GPU or CPU, or a training checkpoint) on the
// chosen device, report test accuracy and show a few predictions.
#pragma once

#include "ddp/process_group.h"
#include "worker/config/config.h"

namespace ddp::worker {

/// Runs the evaluation in this process on `group`'s device (a group of one: no network); writes
/// summary.json. Returns the exit code.
int runEvalMode(const WorkerConfig& config, ProcessGroup& group);

}  // namespace ddp::worker
