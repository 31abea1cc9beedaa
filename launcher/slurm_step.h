// ddp-launch started by srun: one launcher per node starts that node's workers. Several
// launchers per node, or one per node of a job told it is single-node, would each run the whole
// job again (issue 14, item 5): refused with one line that says how to start it instead.
#pragma once

#include "launcher/launch_options.h"
#include "launcher/worker_env.h"

namespace ddp::launcher {

/// Throws ddp::ConfigError when `env` shows this launcher is one of several srun tasks on its
/// node, or one of a multi-node step whose --nnodes/--node_rank do not match the step.
void checkSrunLayout(const LaunchOptions& options, const EnvMap& env);

}  // namespace ddp::launcher
