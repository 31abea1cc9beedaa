#include "launcher/torchrun_compat.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "common/error.h"

namespace ddp::launcher::torchrun {
namespace {

// torchrun's flags read from PET_<NAME> (its argparse `env` and `check_env` actions), by our
// '_' spelling. The switches (check_env) take "1" for on and "0" for off.
const std::vector<std::string> kValueFlags = {
    "nnodes",       "nproc_per_node", "rdzv_backend", "rdzv_id",  "rdzv_conf",   "max_restarts",
    "monitor_interval", "start_method", "role",       "log_dir",  "redirects",   "tee",
    "local_ranks_filter", "node_rank", "shutdown_timeout"};
const std::vector<std::string> kSwitchFlags = {"standalone", "module", "no_python", "run_path"};

std::string upper(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
  return name;
}

std::optional<std::string> lookup(const std::map<std::string, std::string>& env, const std::string& name) {
  const auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

double confSeconds(const std::string& key, const std::string& value) {
  char* end = nullptr;
  const double seconds = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(seconds) || seconds <= 0) {
    DDP_THROW(ConfigError, "--rdzv_conf ", key, "=", value, ": give a positive number of seconds, e.g. ", key, "=30");
  }
  return seconds;
}

}  // namespace

FromEnvironment petArguments(const std::set<std::string>& given, const std::map<std::string, std::string>& env) {
  FromEnvironment out;
  auto add = [&](const std::string& arg) {
    out.args.push_back(arg);
    out.note += (out.note.empty() ? "" : " ") + arg;
  };
  // An elastic (c10d, MIN:MAX) job's nodes are numbered by the rendezvous: an operator's node rank
  // is not for it.
  const auto petBackend = lookup(env, "PET_RDZV_BACKEND");
  const auto petNnodes = lookup(env, "PET_NNODES");
  const bool numberedByRendezvous =
      (petBackend && *petBackend == "c10d") || (petNnodes && petNnodes->find(':') != std::string::npos);
  for (const std::string& flag : kValueFlags) {
    if (given.count(flag) != 0 || (flag == "node_rank" && numberedByRendezvous)) continue;
    if (const auto value = lookup(env, "PET_" + upper(flag)); value && !value->empty()) add("--" + flag + "=" + *value);
  }
  for (const std::string& flag : kSwitchFlags) {
    if (given.count(flag) != 0) continue;
    const auto value = lookup(env, "PET_" + upper(flag));
    if (!value || value->empty() || *value == "0") continue;
    if (*value != "1") {
      DDP_THROW(ConfigError, "PET_", upper(flag), "=", *value, ": torchrun's switches take 1 (on) or 0 (off)");
    }
    add("--" + flag);
  }
  // Where the rendezvous is: the command line's choice wins; between the variables, the endpoint
  // for a c10d rendezvous, MASTER_ADDR/PORT otherwise (an operator may set both).
  const bool masterGiven = given.count("master_addr") != 0 || given.count("master_port") != 0;
  const auto endpoint = lookup(env, "PET_RDZV_ENDPOINT");
  const auto backend = given.count("rdzv_backend") == 0 ? lookup(env, "PET_RDZV_BACKEND") : std::nullopt;
  const bool useEndpoint = given.count("rdzv_endpoint") == 0 && !masterGiven && endpoint && !endpoint->empty() &&
                           (!lookup(env, "PET_MASTER_ADDR") || (backend && *backend == "c10d"));
  if (useEndpoint) add("--rdzv_endpoint=" + *endpoint);
  if (!useEndpoint && given.count("rdzv_endpoint") == 0) {
    for (const std::string flag : {"master_addr", "master_port"}) {
      if (given.count(flag) != 0) continue;
      if (const auto value = lookup(env, "PET_" + upper(flag)); value && !value->empty()) add("--" + flag + "=" + *value);
    }
  }
  if (!out.note.empty()) out.note = "from torchrun's PET_* variables (e.g. a Kubeflow PyTorchJob's): " + out.note;
  return out;
}

std::optional<std::string> unsupportedFlag(const std::string& name) {
  static const std::map<std::string, std::string> kInstead = {
      {"local_addr", "ddp-launch learns this node's address from its connection to the rendezvous; to pick the "
                     "workers' network interface set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME"},
      {"log_line_prefix_template", "ddp-launch prefixes each line with '[rank N] '; drop the flag"},
      {"logs_specs", "choose where output goes with --log_dir, --tee and --redirects"},
      {"numa_binding", "bind in the worker command instead, e.g. ddp-launch ... numactl --cpunodebind=0 ./worker"},
      {"event_log_handler", "ddp-launch logs its events on stderr; drop the flag"},
      {"virtual_local_rank", "use --gpus, which gives each worker its GPUs through CUDA_VISIBLE_DEVICES"},
      {"duplicate_stdout_filters", "write the output to files with --log_dir and filter them with grep"},
      {"duplicate_stderr_filters", "write the output to files with --log_dir and filter them with grep"},
      {"print_completion", "ddp-launch has no shell completion; see ddp-launch --help"},
      {"signals_to_handle", "ddp-launch forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2; drop the flag"},
  };
  const auto it = kInstead.find(name);
  if (it == kInstead.end()) return std::nullopt;
  return "torchrun's --" + name + " is not a ddp-launch option: " + it->second;
}

void applyRdzvConf(const std::string& conf, ElasticOptions& elastic) {
  std::optional<double> interval, attempts;
  std::istringstream in(conf);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) continue;
    const size_t equals = item.find('=');
    const std::string key = item.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : item.substr(equals + 1);
    if (key == "join_timeout") {
      elastic.rdzvTimeoutS = confSeconds(key, value);
    } else if (key == "last_call_timeout") {
      elastic.lastCallS = confSeconds(key, value);
    } else if (key == "keep_alive_interval") {
      interval = confSeconds(key, value);
    } else if (key == "keep_alive_max_attempt") {
      attempts = confSeconds(key, value);
    } else if (key != "read_timeout" && key != "close_timeout" && key != "timeout" && key != "is_host" &&
               key != "store_type" && key != "use_libuv") {
      DDP_THROW(ConfigError, "--rdzv_conf: unknown key '", key, "'; ddp-launch takes join_timeout, "
                "last_call_timeout, keep_alive_interval, keep_alive_max_attempt (and accepts read_timeout, "
                "close_timeout, timeout, is_host), e.g. --rdzv_conf=join_timeout=900,last_call_timeout=30");
    }
  }
  // torchrun declares a node dead after keep_alive_max_attempt missed beats of keep_alive_interval.
  if (interval || attempts) elastic.heartbeatTimeoutS = interval.value_or(5) * attempts.value_or(3);
}

bool streamsOfEveryRank(const std::string& flag, const std::string& value) {
  if (value == "0") return false;
  if (value == "3") return true;
  DDP_THROW(ConfigError, "--", flag, "=", value, ": ddp-launch sends both streams of every rank to the same "
            "place; give --", flag, "=3 (or 0), and --log_dir=DIR for the files");
}

void applyInterpreter(LaunchOptions& options, bool module, bool runPath, bool noPython) {
  if (noPython && (module || runPath)) {
    DDP_THROW(ConfigError, "--no_python runs WORKER as it is, but --", module ? "module" : "run_path",
              " runs it through Python; keep one");
  }
  bool python = module || runPath;
  if (!python && !noPython && options.worker.size() > 3 &&
      options.worker.compare(options.worker.size() - 3, 3, ".py") == 0) {
    // An executable script with its own #! line picks its interpreter; any other .py gets Python.
    std::ifstream script(options.worker);
    char first[2] = {0, 0};
    script.read(first, 2);
    const bool shebang = script.gcount() == 2 && first[0] == '#' && first[1] == '!';
    python = !(shebang && ::access(options.worker.c_str(), X_OK) == 0);
  }
  if (!python) return;
  std::vector<std::string> args = {"-u"};  // unbuffered, as torchrun runs it: lines arrive as printed
  if (module) args.push_back("-m");
  args.push_back(options.worker);
  args.insert(args.end(), options.workerArgs.begin(), options.workerArgs.end());
  options.worker = "python3";
  options.workerArgs = std::move(args);
}

void checkInheritedWorld(const LaunchOptions& options, const std::map<std::string, std::string>& env) {
  if (options.nnodesGiven || options.elastic.enabled || options.nnodes != 1) return;
  const std::string worldSize = lookup(env, "WORLD_SIZE").value_or("");
  if (worldSize.empty() || worldSize.size() > 9 || worldSize.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(worldSize) < 2) {
    return;
  }
  const std::string rank = lookup(env, "RANK").value_or("?");
  DDP_THROW(ConfigError, "the environment says this is one of WORLD_SIZE=", worldSize, " processes (RANK=", rank,
            "; a cluster operator such as Kubeflow's PyTorchJob sets these in each pod), but no --nnodes was "
            "given, so ddp-launch would train alone as a separate job; pass --nnodes=", worldSize,
            " --node_rank=$RANK --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT (or the PET_* variables "
            "torchrun reads), or --standalone (or unset WORLD_SIZE) to train on this node alone");
}

}  // namespace ddp::launcher::torchrun
