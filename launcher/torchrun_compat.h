// torchrun's command-line surface on ddp-launch, so a job script or a cluster manifest written for
// torchrun runs unchanged: PET_<FLAG> variables as the defaults of flags (torchrun's argparse
// `env` action; a Kubeflow PyTorchJob sets them in each pod), torchrun's flags that ddp-launch has
// under its own name or not at all, and how WORKER is run (as a program, or through Python).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/launch_options.h"

namespace ddp::launcher::torchrun {

/// What PET_* variables add to the command line.
struct FromEnvironment {
  std::vector<std::string> args;  // "--nnodes=2", "--standalone", ...
  std::string note;               // the start-up line naming them; "" when none
};

/// PET_<FLAG> for each torchrun flag that `given` (long names, '_' spelling) lacks. Where the
/// rendezvous is comes from PET_RDZV_ENDPOINT or PET_MASTER_ADDR/PORT, never from both.
FromEnvironment petArguments(const std::set<std::string>& given, const std::map<std::string, std::string>& env);

/// For a torchrun flag that ddp-launch does not take: the line that says what to use instead.
std::optional<std::string> unsupportedFlag(const std::string& name);

/// torchrun's --rdzv_conf=K=V,...: join_timeout, last_call_timeout and keep_alive_interval x
/// keep_alive_max_attempt as --rdzv_timeout_s, --rdzv_last_call_s and --heartbeat_timeout_s;
/// read_timeout, close_timeout, timeout and is_host are accepted (nothing to set here).
void applyRdzvConf(const std::string& conf, ElasticOptions& elastic);

/// torchrun's --redirects/--tee value: 0 (nothing), or 3 (both streams of every rank). Per-stream
/// (1, 2) and per-rank ("0:3,1:0") values are refused with what to use instead.
bool streamsOfEveryRank(const std::string& flag, const std::string& value);

/// How WORKER runs: -m/--module (python3 -u -m WORKER ...), --run_path (python3 -u WORKER ...),
/// --no_python (as it is), else a .py that is not an executable #! script runs through python3 -u
/// on PATH, as torchrun runs every script through Python.
void applyInterpreter(LaunchOptions& options, bool module, bool runPath, bool noPython);

/// Throws ddp::ConfigError when the environment says this is one of several processes of a job
/// (WORLD_SIZE > 1: a cluster operator's pod index and count, e.g. Kubeflow's PyTorchJob without
/// PET_* variables) but nothing on the command line says how the nodes meet: ddp-launch would
/// train alone as a separate world-1 job, and overwrite the workers' RANK and WORLD_SIZE.
void checkInheritedWorld(const LaunchOptions& options, const std::map<std::string, std::string>& env);

}  // namespace ddp::launcher::torchrun
