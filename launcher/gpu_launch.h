// --gpus and --nproc_per_node=auto: which GPUs the workers get, and how many workers.
#pragma once

#include <string>

#include "launcher/launch_options.h"
#include "launcher/worker_env.h"

namespace ddp::launcher {

/// Applies --gpus (NVML's table, chooseGpus()) and --nproc_per_node=auto to `options`: sets
/// cudaVisibleDevices and nprocPerNode. auto without --gpus = the GPUs NVML shows (as many as
/// CUDA_VISIBLE_DEVICES names, when set), else the CPUs this process may run on (torchrun's
/// rule). Returns the lines to log (the GPU table; what auto became); "" when neither flag was
/// given. Throws ConfigError: --gpus without NVML, too few suitable GPUs, a worker count that
/// contradicts the GPUs chosen.
std::string resolveGpus(LaunchOptions& options, const EnvMap& environment);

}  // namespace ddp::launcher
