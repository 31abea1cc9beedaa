// Turning the parsed options into the exact commands to start, before starting any.
#pragma once

#include <vector>

#include "launcher/launch_options.h"
#include "launcher/worker_env.h"
#include "launcher/worker_process.h"

namespace ddp::launcher {

/// Everything needed to start this node's workers; every check that can fail has run.
struct LaunchPlan {
  std::vector<WorkerCommand> commands;  // by local rank
  std::vector<int> ranks;               // global rank of each command
  int masterPort = 0;
  double shutdownGraceS = 5.0;
};

/// Resolves the worker program, picks MASTER_PORT (a free one for single-node jobs without
/// --master_port) and builds each worker's argv and environment from `inherited`.
/// Logs the OMP_NUM_THREADS default once. Throws ddp::ConfigError; starts nothing.
LaunchPlan makeLaunchPlan(const LaunchOptions& options, const EnvMap& inherited);

}  // namespace ddp::launcher
