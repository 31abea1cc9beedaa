// The distributed environment a worker is started with: torchrun's env
// contract, or Slurm's / Open MPI's when RANK is absent.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launch_env.h"  // launchEnv, takeLegacyLocalRank: this, as users see it

namespace ddp::runtime {

struct DistEnv {
  int rank = 0;
  int localRank = 0;
  int worldSize = 1;
  int localWorldSize = 1;
  int groupRank = 0;  // node rank
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  int restartCount = 0;
  /// TORCHELASTIC_USE_AGENT_STORE=True with MASTER_ADDR and MASTER_PORT set: torchrun's agent
  /// already serves the store there, so every rank, rank 0 included, connects as a client.
  bool agentStore = false;
  std::string source = "default";  // torchrun | slurm | openmpi | default
  /// The job's token: DDP_RDZV_TOKEN (ddp-launch sets it), else the file DDP_RDZV_TOKEN_FILE names;
  /// empty when neither is set (the store then admits any client).
  std::string token;
  std::string tokenSource;  // where the token came from, for messages
  /// DDP_STORE_FD: the listening socket ddp-launch bound for rank 0, else -1.
  int storeFd = -1;
  /// DDP_RDZV_BIND: where rank 0 binds the store when it binds it itself; empty: MASTER_ADDR.
  std::string rdzvBind;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// The process environment.
EnvLookup processEnv();

/// Reads RANK/LOCAL_RANK/WORLD_SIZE/... (or SLURM_*, OMPI_COMM_WORLD_*);
/// `legacyLocalRank` is the old `--local_rank=N` argument if one was given.
/// Throws ConfigError for a malformed or inconsistent value, naming the variable.
DistEnv readDistEnv(const EnvLookup& env, std::optional<int> legacyLocalRank = std::nullopt);


}  // namespace ddp::runtime
