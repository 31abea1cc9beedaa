#include "launcher/slurm_step.h"

#include <algorithm>

#include <string>

#include "common/cluster_env.h"
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

// A task of an srun step (ddp::inSrunStep): a ddp-launch run directly in an sbatch script's shell
// is one launcher, as it should be.
// The launcher lays out the step from SLURM_STEP_TASKS_PER_NODE: without it (a step id alone, as
// some environments pass on) it runs as a plain launcher.
bool inSrunStep(const EnvMap& env) {
  return !get(env, "SLURM_PROCID").empty() && !get(env, "SLURM_STEP_TASKS_PER_NODE").empty() &&
         ddp::inSrunStep(get(env, "SLURM_STEP_ID"), get(env, "SLURM_STEP_TASKS_PER_NODE"));
}

// Entries of a comma-separated list such as SLURM_STEP_GPUS="0,1,3"; 0 when empty.
int listLength(const std::string& list) {
  if (list.empty()) return 0;
  int n = 1;
  for (char c : list) n += c == ',' ? 1 : 0;
  return n;
}

}  // namespace

std::string applySrunStep(LaunchOptions& options, const EnvMap& env) {
  if (!inSrunStep(env)) return "";
  const std::string layoutValue = get(env, "SLURM_STEP_TASKS_PER_NODE");
  const auto perNode = expandTasksPerNode("SLURM_STEP_TASKS_PER_NODE", layoutValue);
  const int node = number(env, "SLURM_NODEID", 0);
  if (node >= static_cast<int>(perNode.size()) || perNode[static_cast<std::size_t>(node)] != 1) return "";

  std::string derived;
  auto note = [&derived](const std::string& text) { derived += (derived.empty() ? "" : " ") + text; };
  const int nodes = number(env, "SLURM_STEP_NUM_NODES", static_cast<int>(perNode.size()));
  if (!options.nnodesGiven) {
    options.nnodes = nodes;
    note("--nnodes=" + std::to_string(nodes));
  }
  if (!options.nodeRankGiven && !options.elastic.enabled) {  // elastic: the rendezvous ranks the nodes
    options.nodeRank = node;
    note("--node_rank=" + std::to_string(node));
  }
  // A --nnodes/--node_rank given by hand that contradicts the step: checkSrunLayout says so.
  if (options.nnodes > 1 && !options.masterAddrGiven) {
    bool found = false;
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      const std::string list = get(env, name);
      if (list.empty()) continue;
      options.masterAddr = firstHost(name, list);
      note("--master_addr=" + options.masterAddr);
      found = true;
      break;
    }
    if (!found) {
      DDP_THROW(ConfigError, "under srun with ", options.nnodes, " nodes but neither SLURM_STEP_NODELIST nor "
                "SLURM_JOB_NODELIST is set: pass --master_addr=<host of node 0>");
    }
  }
  if (options.nnodes > 1 && !options.masterPort) {
    const std::string job = get(env, "SLURM_JOB_ID");
    if (!job.empty() && job.find_first_not_of("0123456789") == std::string::npos && job.size() < 19) {
      options.masterPort = clusterJobPort(std::stoull(job), slurmStepNumber(get(env, "SLURM_STEP_ID")));
      note("--master_port=" + std::to_string(*options.masterPort));
    }
  }
  if (!options.nprocPerNodeGiven) {
    int gpus = number(env, "SLURM_GPUS_ON_NODE", 0);
    std::string from = "SLURM_GPUS_ON_NODE";
    for (const char* name : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS"}) {
      if (gpus > 0) break;
      gpus = listLength(get(env, name));
      from = name;
    }
    int nproc = gpus;
    if (gpus <= 0) {
      from = get(env, "SLURM_CPUS_PER_TASK").empty() ? "SLURM_CPUS_ON_NODE" : "SLURM_CPUS_PER_TASK";
      nproc = number(env, from.c_str(), 1);
    }
    if (nproc >= 1) {
      options.nprocPerNode = nproc;
      note("--nproc_per_node=" + std::to_string(nproc) + " (" + from + "=" + get(env, from.c_str()) + ")");
    }
  }
  if (derived.empty()) return "";
  return "under srun (job " + get(env, "SLURM_JOB_ID") + " step " + get(env, "SLURM_STEP_ID") + ", node " +
         std::to_string(node) + " of " + std::to_string(nodes) + "): " + derived;
}

void checkSrunLayout(const LaunchOptions& options, const EnvMap& env) {
  if (!inSrunStep(env)) return;
  const std::string layoutValue = get(env, "SLURM_STEP_TASKS_PER_NODE");
  const int node = number(env, "SLURM_NODEID", 0);
  const auto perNode = expandTasksPerNode("SLURM_STEP_TASKS_PER_NODE", layoutValue);
  const int tasksHere = node < static_cast<int>(perNode.size()) ? perNode[static_cast<std::size_t>(node)] : 1;
  const std::string layout = "SLURM_STEP_TASKS_PER_NODE=" + layoutValue;
  int most = 1;
  for (int n : perNode) most = std::max(most, n);
  if (most > 1) {
    // Every node refuses (a node of one task too, when another has several: `srun -N2 -n3`). Inside
    // an allocation of more tasks srun keeps its SLURM_NTASKS and ignores --ntasks-per-node=1 alone
    // ("can't honor"): the advice gives -n as well.
    const std::string nodes = std::to_string(perNode.size());
    DDP_THROW(ConfigError,
              tasksHere > 1 ? "ddp-launch is one of " + std::to_string(tasksHere) + " srun tasks on this node ("
                            : "this srun step runs up to " + std::to_string(most) + " ddp-launch tasks on a node (",
              layout, "), and each would start the whole job again; start one launcher per node with srun -n ",
              nodes, " --ntasks-per-node=1 ddp-launch ... (or let srun start the workers: srun -n N worker CONFIG)");
  }
  const int tasks = number(env, "SLURM_STEP_NUM_TASKS", number(env, "SLURM_NTASKS", 1));
  if (tasks > 1 && !options.elastic.enabled && (options.nnodes != tasks || options.nodeRank != node)) {
    DDP_THROW(ConfigError, "ddp-launch runs on ", tasks, " nodes of this srun step (SLURM_NODEID=", node,
              ") but was given --nnodes=", options.nnodes, " --node_rank=", options.nodeRank,
              ", so the nodes would not form one job; drop --nnodes and --node_rank (ddp-launch takes them "
              "from the step) or pass --nnodes=$SLURM_STEP_NUM_NODES --node_rank=$SLURM_NODEID");
  }
}

}  // namespace ddp::launcher
