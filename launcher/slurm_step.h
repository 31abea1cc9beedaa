// ddp-launch started by srun: one launcher per node starts that node's workers. Several
// launchers per node, or one per node of a job told it is single-node, would each run the whole
// job again (issue 14, item 5): refused with one line that says how to start it instead.
#pragma once

#include "launcher/launch_options.h"
#include "launcher/worker_env.h"

namespace ddp::launcher {

/// Under srun (one task per node), fills what the command line left out from the step: --nnodes
/// (SLURM_STEP_NUM_NODES), --node_rank (SLURM_NODEID), --master_addr (first host of
/// SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST) and --master_port (clusterJobPort of
/// SLURM_JOB_ID) for multi-node steps, and --nproc_per_node from the GPUs Slurm gave this node
/// (SLURM_GPUS_ON_NODE, else the SLURM_STEP_GPUS / SLURM_JOB_GPUS list), else its CPUs
/// (SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE). Returns what it derived, for one log line
/// ("" outside an srun step, or with several tasks on this node: checkSrunLayout refuses those).
std::string applySrunStep(LaunchOptions& options, const EnvMap& env);

/// Throws ddp::ConfigError when `env` shows this launcher is one of several srun tasks on its
/// node, or one of a multi-node step whose --nnodes/--node_rank do not match the step.
void checkSrunLayout(const LaunchOptions& options, const EnvMap& env);

}  // namespace ddp::launcher
