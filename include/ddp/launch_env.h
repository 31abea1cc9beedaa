// Where this process stands in its job, before any process group exists: what its launcher said
// (ddp-launch and torchrun's env contract, Slurm's srun, Open MPI's mpirun; a program started alone
// is rank 0 of 1). For log lines, per-host settings (threads per rank) and checks that come before
// ddp::initProcessGroup, which reads the same environment.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddp {

struct LaunchEnv {
  int rank = 0;            // RANK
  int localRank = 0;       // LOCAL_RANK: this process's index on its host
  int worldSize = 1;       // WORLD_SIZE
  int localWorldSize = 1;  // LOCAL_WORLD_SIZE: processes of the job on this host
  int nodeRank = 0;        // GROUP_RANK (torchrun's node rank)
  int restartCount = 0;    // TORCHELASTIC_RESTART_COUNT: how often the launcher restarted the job
  std::string source = "default";  // who said so: torchrun (also ddp-launch) | slurm | openmpi | default
};

/// Reads the environment as ddp::initProcessGroup does: torchrun's variables (RANK, WORLD_SIZE,
/// LOCAL_RANK, ...), else Slurm's (SLURM_PROCID, ...), else Open MPI's (OMPI_COMM_WORLD_RANK, ...).
/// `legacyLocalRank` is the LOCAL_RANK of a `--local_rank` argument (see takeLegacyLocalRank).
/// ConfigError, one line, for an environment that contradicts itself (RANK >= WORLD_SIZE, a
/// --local_rank other than LOCAL_RANK) or a job token (DDP_RDZV_TOKEN, DDP_RDZV_TOKEN_FILE) that
/// cannot be used. The token itself is not part of the result.
LaunchEnv launchEnv(std::optional<int> legacyLocalRank = std::nullopt);

/// torch.distributed.launch without --use_env passes `--local_rank=N` (or `--local-rank N`) to the
/// program: removes it from `args` and returns N (for InitOptions::legacyLocalRank); nullopt when
/// `args` has none. ConfigError when N is not a number.
std::optional<int> takeLegacyLocalRank(std::vector<std::string>& args);

}  // namespace ddp
