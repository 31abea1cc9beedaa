#include "libddp/runtime/env.h"

#include <algorithm>
#include <cstdlib>

#include "common/cluster_env.h"
#include "common/error.h"
#include "common/job_token.h"
#include "common/slurm_layout.h"

namespace ddp::runtime {
namespace {

int parseInt(const std::string& name, const std::string& value, int minimum) {
  std::size_t used = 0;
  long parsed = 0;
  try {
    parsed = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || parsed < minimum || parsed > 1 << 30) {
    DDP_THROW(ConfigError, "environment: ", name, "='", value, "' is not an integer >= ", minimum);
  }
  return static_cast<int>(parsed);
}

unsigned long long jobId(const std::string& name, const std::string& value) {
  if (value.empty() || value.size() > 19 || value.find_first_not_of("0123456789") != std::string::npos) {
    DDP_THROW(ConfigError, "environment: ", name, "='", value, "' is not a job id (a whole number)");
  }
  return std::stoull(value);
}

std::optional<int> intVar(const EnvLookup& env, const std::string& name, int minimum) {
  auto v = env(name);
  if (!v) return std::nullopt;
  return parseInt(name, *v, minimum);
}

// Ranks of this step on this node. srun sets SLURM_STEP_TASKS_PER_NODE (the step's layout) and
// SLURM_NODEID (this node's index in the step); SLURM_NTASKS_PER_NODE is set only when the user
// asked for --ntasks-per-node, so it cannot be the only source (plain `srun -N2 -n4` lacks it).
std::optional<int> slurmTasksOnThisNode(const EnvLookup& env) {
  const int node = intVar(env, "SLURM_NODEID", 0).value_or(0);
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (auto v = env(name); v && !v->empty()) {
      const auto perNode = expandTasksPerNode(name, *v);
      if (node >= static_cast<int>(perNode.size())) {
        DDP_THROW(ConfigError, "environment: SLURM_NODEID=", node, " but ", name, "='", *v, "' lists ",
                  perNode.size(), " node(s)");
      }
      return perNode[static_cast<std::size_t>(node)];
    }
  }
  return intVar(env, "SLURM_NTASKS_PER_NODE", 1);
}

}  // namespace

EnvLookup processEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

// torchrun's (and ddp-launch's) contract: RANK, WORLD_SIZE, LOCAL_RANK, ...
void readTorchrun(const EnvLookup& env, std::optional<int> legacyLocalRank, DistEnv& out) {
  out.source = "torchrun";
  out.rank = *intVar(env, "RANK", 0);
  out.worldSize = intVar(env, "WORLD_SIZE", 1).value_or(1);
  out.localRank = intVar(env, "LOCAL_RANK", 0).value_or(legacyLocalRank.value_or(out.rank));
  out.localWorldSize = intVar(env, "LOCAL_WORLD_SIZE", 1).value_or(out.worldSize);
  out.groupRank = intVar(env, "GROUP_RANK", 0).value_or(0);
}

void readOpenMpi(const EnvLookup& env, DistEnv& out) {
  out.source = "openmpi";
  out.rank = *intVar(env, "OMPI_COMM_WORLD_RANK", 0);
  out.worldSize = intVar(env, "OMPI_COMM_WORLD_SIZE", 1).value_or(1);
  out.localRank = intVar(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0).value_or(0);
  out.localWorldSize = intVar(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1).value_or(out.worldSize);
  out.groupRank = intVar(env, "OMPI_COMM_WORLD_NODE_RANK", 0).value_or(0);
  const int nodes = intVar(env, "OMPI_MCA_orte_num_nodes", 1).value_or(out.localWorldSize < out.worldSize ? 2 : 1);
  if (nodes > 1 && !env("MASTER_ADDR")) {
    // Open MPI's environment names mpirun's host (orte_hnp_uri), not the host of rank 0.
    DDP_THROW(ConfigError, "environment: mpirun started the ", out.worldSize, " ranks on ", nodes,
              " hosts and Open MPI does not tell which one runs rank 0; export MASTER_ADDR=<host of rank 0> "
              "MASTER_PORT=<free port> and pass them on: mpirun -x MASTER_ADDR -x MASTER_PORT ...");
  }
  if (auto job = env("OMPI_MCA_ess_base_jobid"); job && !job->empty()) {
    out.masterPort = clusterJobPort(jobId("OMPI_MCA_ess_base_jobid", *job));
  }
}

// A task of an srun step (ddp::inSrunStep): a program an sbatch script's shell runs directly is one
// process (as rank 0 of SLURM_NTASKS it waited for ranks that never came).
bool inSlurmStep(const EnvLookup& env) {
  return inSrunStep(env("SLURM_STEP_ID").value_or(""), env("SLURM_STEP_TASKS_PER_NODE").value_or(""));
}

void readSlurm(const EnvLookup& env, DistEnv& out) {
  out.source = "slurm";
  out.rank = *intVar(env, "SLURM_PROCID", 0);
  out.worldSize = intVar(env, "SLURM_STEP_NUM_TASKS", 1).value_or(*intVar(env, "SLURM_NTASKS", 1));
  out.localRank = intVar(env, "SLURM_LOCALID", 0).value_or(0);
  out.localWorldSize = slurmTasksOnThisNode(env).value_or(out.worldSize);
  out.groupRank = intVar(env, "SLURM_NODEID", 0).value_or(0);
  // Rank 0 runs on node 0 of the step, the first host of its node list (srun's block layout
  // gives the lowest ranks to the first node); the port depends only on the job.
  const int nodes = intVar(env, "SLURM_STEP_NUM_NODES", 1).value_or(out.localWorldSize < out.worldSize ? 2 : 1);
  if (nodes > 1) {
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = env(name); list && !list->empty()) {
        out.masterAddr = firstHost(name, *list);
        break;
      }
    }
  }
  if (auto job = env("SLURM_JOB_ID"); job && !job->empty()) {
    out.masterPort = clusterJobPort(jobId("SLURM_JOB_ID", *job), slurmStepNumber(env("SLURM_STEP_ID").value_or("")));
  }
}

// What every launcher shares: the store's address, torchrun's restarts and agent store, the token.
void readStoreAndToken(const EnvLookup& env, DistEnv& out) {
  if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) out.masterAddr = *addr;
  if (auto port = intVar(env, "MASTER_PORT", 1)) {
    if (*port > 65535) DDP_THROW(ConfigError, "environment: MASTER_PORT=", *port, " is not a TCP port");
    out.masterPort = *port;
  }
  out.restartCount = intVar(env, "TORCHELASTIC_RESTART_COUNT", 0).value_or(0);
  // torch.distributed.rendezvous._agent_store_serves: the literal "True", and the agent only
  // promises a server at the MASTER_ADDR:MASTER_PORT it exported, which is where we connect.
  const auto masterAddr = env("MASTER_ADDR");
  out.agentStore = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True" && masterAddr &&
                   !masterAddr->empty() && env("MASTER_PORT").has_value();
  if (auto token = env(kTokenEnv); token && !token->empty()) {
    out.token = checkedToken(*token, kTokenEnv);
    out.tokenSource = kTokenEnv;
  } else if (auto file = env(kTokenFileEnv); file && !file->empty()) {
    out.token = readTokenFile(*file);
    out.tokenSource = std::string(kTokenFileEnv) + "=" + *file;
  }
  if (out.rank == 0) out.storeFd = intVar(env, kStoreFdEnv, 0).value_or(-1);
  out.rdzvBind = env("DDP_RDZV_BIND").value_or("");
}

}  // namespace

DistEnv readDistEnv(const EnvLookup& env, std::optional<int> legacyLocalRank) {
  DistEnv out;
  if (env("RANK")) {
    readTorchrun(env, legacyLocalRank, out);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    // Before Slurm's: mpirun inside an allocation starts its daemons with srun, so its ranks
    // inherit SLURM_PROCID (the daemon's node) as well.
    readOpenMpi(env, out);
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS") && inSlurmStep(env)) {
    readSlurm(env, out);
  } else {
    // torchrun's contract without its RANK: a world of one would train alone, and every process
    // started this way as rank 0 (PyTorch's env:// refuses a missing RANK always).
    if (const auto world = intVar(env, "WORLD_SIZE", 1); world && *world > 1) {
      DDP_THROW(ConfigError, "environment: WORLD_SIZE=", *world, " but RANK is not set, so this process cannot "
                "tell which of the ", *world, " ranks it is; start the job with ddp-launch (or torchrun), which sets "
                "RANK for each process, or export RANK=0..", *world - 1, " per process");
    }
    if (legacyLocalRank) {
      out.source = "torchrun";
      out.localRank = *legacyLocalRank;
    }
  }
  if (legacyLocalRank && *legacyLocalRank != out.localRank) {
    DDP_THROW(ConfigError, "environment: --local_rank=", *legacyLocalRank,
              " disagrees with LOCAL_RANK=", out.localRank);
  }
  readStoreAndToken(env, out);
  if (out.rank >= out.worldSize) {
    DDP_THROW(ConfigError, "environment: rank ", out.rank, " (from ", out.source,
              ") is not below the world size ", out.worldSize);
  }
  if (out.localRank >= out.localWorldSize && out.localWorldSize > 0 && out.source != "default") {
    DDP_THROW(ConfigError, "environment: LOCAL_RANK ", out.localRank,
              " is not below LOCAL_WORLD_SIZE ", out.localWorldSize);
  }
  return out;
}

}  // namespace ddp::runtime

namespace ddp {

LaunchEnv launchEnv(std::optional<int> legacyLocalRank) {
  const runtime::DistEnv env = runtime::readDistEnv(runtime::processEnv(), legacyLocalRank);
  LaunchEnv out;
  out.rank = env.rank;
  out.localRank = env.localRank;
  out.worldSize = env.worldSize;
  out.localWorldSize = env.localWorldSize;
  out.nodeRank = env.groupRank;
  out.restartCount = env.restartCount;
  out.source = env.source;
  return out;
}

std::optional<int> takeLegacyLocalRank(std::vector<std::string>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    for (const std::string flag : {"--local_rank", "--local-rank"}) {
      if (a.rfind(flag + "=", 0) == 0) {
        int v = runtime::parseInt(flag, a.substr(flag.size() + 1), 0);
        args.erase(args.begin() + static_cast<long>(i));
        return v;
      }
      if (a == flag && i + 1 < args.size()) {
        int v = runtime::parseInt(flag, args[i + 1], 0);
        args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
        return v;
      }
    }
  }
  return std::nullopt;
}

}  // namespace ddp
