#include "launcher/slurm_step.h"

#include <string>

#include "common/error.h"
#include "common/slurm_layout.h"

namespace ddp::launcher {
namespace {

std::string get(const EnvMap& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

int number(const EnvMap& env, const char* name, int fallback) {
  const std::string text = get(env, name);
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 9) return fallback;
  return std::stoi(text);
}

}  // namespace

void checkSrunLayout(const LaunchOptions& options, const EnvMap& env) {
  // A task of an srun step: srun sets SLURM_STEP_TASKS_PER_NODE for its tasks. An sbatch script's
  // own shell (the batch step, SLURM_STEP_ID 4294967294) has only SLURM_TASKS_PER_NODE: a
  // ddp-launch run there directly is one launcher, as it should be.
  const std::string layoutValue = get(env, "SLURM_STEP_TASKS_PER_NODE");
  const std::string step = get(env, "SLURM_STEP_ID");
  if (layoutValue.empty() || get(env, "SLURM_PROCID").empty() || step == "4294967294" || step == "batch") return;
  const int node = number(env, "SLURM_NODEID", 0);
  const auto perNode = expandTasksPerNode("SLURM_STEP_TASKS_PER_NODE", layoutValue);
  const int tasksHere = node < static_cast<int>(perNode.size()) ? perNode[static_cast<std::size_t>(node)] : 1;
  const std::string layout = "SLURM_STEP_TASKS_PER_NODE=" + layoutValue;
  if (tasksHere > 1) {
    DDP_THROW(ConfigError, "ddp-launch is one of ", tasksHere, " srun tasks on this node (", layout,
              "), and each would start the whole job again; start one launcher per node with srun "
              "--ntasks-per-node=1 ddp-launch ... (or let srun start the workers: srun -n N worker CONFIG)");
  }
  const int tasks = number(env, "SLURM_STEP_NUM_TASKS", number(env, "SLURM_NTASKS", 1));
  if (tasks > 1 && (options.nnodes != tasks || options.nodeRank != node)) {
    DDP_THROW(ConfigError, "ddp-launch runs on ", tasks, " nodes of this srun step (SLURM_NODEID=", node,
              ") but was given --nnodes=", options.nnodes, " --node_rank=", options.nodeRank,
              ", so the nodes would not form one job; pass --nnodes=$SLURM_NNODES --node_rank=$SLURM_NODEID "
              "--master_addr=<first host of $SLURM_JOB_NODELIST> --rdzv_token_file=<a file on shared storage>");
  }
}

}  // namespace ddp::launcher
