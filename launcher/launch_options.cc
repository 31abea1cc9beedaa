#include "launcher/launch_options.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <cxxopts.hpp>

#include "common/error.h"
#include "common/sha256.h"
#include "launcher/launch_args.h"
#include "launcher/torchrun_compat.h"

#ifndef DDP_LAUNCH_VERSION
#define DDP_LAUNCH_VERSION "unknown"
#endif

namespace ddp::launcher {
namespace detail {
namespace {

constexpr const char* kProgram = "ddp-launch";
// More restarts than this is a typo, not a plan.
constexpr int kMaxRestartsLimit = 1000000;

// Values are taken as strings and converted here, so a bad value gets a message
// that names the flag and the fix instead of cxxopts' generic one.
cxxopts::Options makeOptions() {
  cxxopts::Options options(kProgram,
                           "Starts one worker process per device and watches them, like torchrun.\n"
                           "Every option also accepts '-' instead of '_' (--nproc-per-node).");
  options.custom_help("[options] WORKER [worker args...]");
  options.set_width(100);
  // clang-format off
  options.add_options()
    ("nproc_per_node", "Workers to start on this node; auto = the GPUs --gpus chose (without --gpus: "
        "the visible GPUs, else the CPUs this process may use); gpu = the visible GPUs; cpu = the CPUs", cxxopts::value<std::string>()->default_value("1"), "N")
    ("gpus", "Choose the GPUs: auto = every idle GPU, auto:N = the N with most free memory, 0,2 = "
        "those (nvidia-smi numbers); prints the table it chose from", cxxopts::value<std::string>(), "SPEC")
    ("gpu_max_used_mb", "--gpus auto skips GPUs with more memory in use than this",
        cxxopts::value<std::string>()->default_value("1024"), "MIB")
    ("gpu_max_util", "--gpus auto skips GPUs busier than this (percent)",
        cxxopts::value<std::string>()->default_value("30"), "PERCENT")
    ("nnodes", "Nodes in the job; MIN:MAX = an elastic job: nodes may leave and join, each rendezvous "
        "round runs with what is there (at least MIN)", cxxopts::value<std::string>()->default_value("1"), "N|MIN:MAX")
    ("node_rank", "Rank of this node, 0 .. nnodes-1", cxxopts::value<std::string>()->default_value("0"), "R")
    ("master_addr", "Address of the node that runs rank 0",
        cxxopts::value<std::string>()->default_value("127.0.0.1"), "ADDR")
    ("master_port", "Port rank 0 listens on (default: a free port when nnodes is 1, else 29500)",
        cxxopts::value<std::string>(), "PORT")
    ("standalone", "Single-node job on a free port (torchrun's --standalone)")
    ("use_env", "Pass the local rank only in LOCAL_RANK; --use_env=false (or --no_use_env) also "
        "passes --local_rank=N as the first worker argument",
        cxxopts::value<std::string>()->default_value("true")->implicit_value("true"), "BOOL")
    ("no_use_env", "Same as --use_env=false")
    ("shutdown_grace_s", "Seconds between SIGTERM and SIGKILL when stopping workers",
        cxxopts::value<std::string>()->default_value("5"), "SECONDS")
    ("early_exit_grace_s", "A worker that exits 0 while others still run this many seconds later "
        "left early: the job is stopped as failed (off: wait for every worker however long)",
        cxxopts::value<std::string>()->default_value("30"), "SECONDS")
    ("max_restarts", "Times to restart the whole group after a worker fails (each attempt gets "
        "TORCHELASTIC_RESTART_COUNT and a fresh free port)",
        cxxopts::value<std::string>()->default_value("0"), "N")
    ("log_dir", "Write each rank's output to DIR/rank_N.log (DIR/attempt_K/rank_N.log with "
        "--max_restarts > 0) instead of the console", cxxopts::value<std::string>(), "DIR")
    ("t,tee", "With --log_dir, copy the workers' output to the console as well (torchrun's --tee=3; 0 = off)",
        cxxopts::value<std::string>()->implicit_value("3"), "3|0")
    ("r,redirects", "torchrun's --redirects: 3 = each rank's output to --log_dir files only (ddp-launch's "
        "--log_dir alone does this); 0 = off", cxxopts::value<std::string>(), "3|0")
    ("local_ranks_filter", "Show only these local ranks' output on the console (files get every line), "
        "e.g. 0 or 0,3", cxxopts::value<std::string>(), "LIST")
    ("ranks_filter", "Show only these global ranks' output on the console, e.g. 0",
        cxxopts::value<std::string>(), "LIST")
    ("role", "The workers' role: ROLE_NAME (torchrun's --role)",
        cxxopts::value<std::string>()->default_value("default"), "NAME")
    ("m,module", "Run WORKER as a Python module: python3 -u -m WORKER ARGS (torchrun's -m)")
    ("run_path", "Run WORKER through Python: python3 -u WORKER ARGS (a .py does so unless it is an "
        "executable #! script)")
    ("no_python", "Run WORKER as it is, never through Python (torchrun's --no_python)")
    ("rdzv_backend", "static (the default; each node gives --node_rank) or c10d (the rendezvous numbers "
        "the nodes: an elastic job of exactly --nnodes nodes); both meet at ddp-launch's own "
        "authenticated store", cxxopts::value<std::string>()->default_value("static"), "static|c10d")
    ("rdzv_conf", "torchrun's rendezvous settings: join_timeout, last_call_timeout, keep_alive_interval, "
        "keep_alive_max_attempt", cxxopts::value<std::string>(), "K=V,...")
    ("monitor_interval", "Accepted for torchrun's scripts: ddp-launch sees a worker's exit at once",
        cxxopts::value<std::string>(), "SECONDS")
    ("start_method", "Accepted for torchrun's scripts (spawn, fork, forkserver): workers are always "
        "started with fork and exec", cxxopts::value<std::string>(), "METHOD")
    ("shutdown_timeout", "torchrun's name for --shutdown_grace_s", cxxopts::value<std::string>(), "SECONDS")
    ("rdzv_token_file", "File (mode 600) with the job's secret token, the same on every node; "
        "needed with --nnodes > 1 (default: DDP_RDZV_TOKEN_FILE; single-node jobs make a fresh one)",
        cxxopts::value<std::string>(), "PATH")
    ("rdzv_bind", "Address node 0 binds the job's store to (default: --master_addr), e.g. 0.0.0.0 "
        "behind NAT", cxxopts::value<std::string>(), "ADDR")
    ("rdzv_endpoint", "torchrun's spelling of --master_addr and --master_port together: HOST[:PORT]",
        cxxopts::value<std::string>(), "HOST[:PORT]")
    ("rdzv_id", "Elastic jobs: the job's id; launchers with the same id and store form one job",
        cxxopts::value<std::string>(), "ID")
    ("rdzv_last_call_s", "Elastic jobs: once MIN nodes are in, close the round after this long "
        "without a new node (or at MAX) (default: 30)", cxxopts::value<std::string>(), "SECONDS")
    ("heartbeat_timeout_s", "Elastic jobs: a node whose launcher is silent this long has left (default: 30)",
        cxxopts::value<std::string>(), "SECONDS")
    ("rdzv_timeout_s", "Elastic jobs: a round that has not MIN nodes after this ends the job (default: 600)",
        cxxopts::value<std::string>(), "SECONDS")
    ("h,help", "Print this help and exit")
    ("version", "Print the version and exit");
  // clang-format on
  return options;
}

OptionTable describe(const cxxopts::Options& options) {
  OptionTable table;
  for (const cxxopts::HelpOptionDetails& option : options.group_help("").options) {
    std::vector<std::string> names = option.l;
    if (!option.s.empty()) names.push_back(option.s);
    // cxxopts' own rule: options with an implicit value never consume the next argument.
    const bool takesValue = !option.is_boolean && !option.has_implicit;
    for (const std::string& name : names) {
      table.names.insert(name);
      if (takesValue) table.takesValue.insert(name);
    }
  }
  return table;
}

int parseInt(const std::string& flag, const std::string& text, int min, int max, const std::string& hint) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < min || value > max) {
    DDP_THROW(ConfigError, "--", flag, " must be a whole number from ", min, " to ", max, " (got '", text,
              "'): ", hint);
  }
  return static_cast<int>(value);
}

double parseSeconds(const std::string& flag, const std::string& text, const std::string& example) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0 || value > kMaxGraceS) {
    DDP_THROW(ConfigError, "--", flag, " must be a number of seconds from 0 to ", kMaxGraceS, " (got '", text,
              "'), e.g. --", flag, "=", example);
  }
  return value;
}

bool parseBool(const std::string& flag, const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return false;
  DDP_THROW(ConfigError, "--", flag, " must be true or false (got '", text, "'), e.g. --", flag, "=false");
}

// cxxopts parses the launcher's own tokens only (splitAtWorker took the worker's away).
cxxopts::ParseResult parseLauncherArgs(cxxopts::Options& options, const std::vector<std::string>& launcherArgs) {
  std::vector<const char*> argv{kProgram};
  for (const std::string& arg : launcherArgs) argv.push_back(arg.c_str());
  try {
    return options.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& error) {
    DDP_THROW(ConfigError, "bad command line: ", error.what(), "; run ddp-launch --help");
  }
}

// The value of an optional flag that must not be empty when given; `into` keeps its default otherwise.
void readNonEmpty(const cxxopts::ParseResult& parsed, const char* flag, std::string& into,
                  const std::string& emptyMessage) {
  if (parsed.count(flag) == 0) return;
  into = parsed[flag].as<std::string>();
  if (into.empty()) DDP_THROW(ConfigError, emptyMessage);
}

// --nproc_per_node and the --gpus choice with its limits.
void parseDevices(const cxxopts::ParseResult& parsed, LaunchOptions& launch) {
  const std::string nproc = parsed["nproc_per_node"].as<std::string>();
  launch.nprocAuto = nproc == "auto" || nproc == "gpu" || nproc == "cpu";  // torchrun's words
  if (launch.nprocAuto) launch.nprocWord = nproc;
  launch.nprocPerNode = launch.nprocAuto ? 1 : parseInt("nproc_per_node", nproc, 1, 4096,
                                 "the number of workers to start on this node, e.g. --nproc_per_node=4 (or auto, gpu, cpu)");
  readNonEmpty(parsed, "gpus", launch.gpus, "--gpus is empty: give auto, auto:N or a list such as 0,2");
  launch.gpuMaxUsedMb = parseInt("gpu_max_used_mb", parsed["gpu_max_used_mb"].as<std::string>(), 0, 1 << 30,
                                 "memory in use (MiB) above which --gpus auto skips a GPU, e.g. --gpu_max_used_mb=2048");
  launch.gpuMaxUtil = parseInt("gpu_max_util", parsed["gpu_max_util"].as<std::string>(), 0, 100,
                               "utilisation (percent) above which --gpus auto skips a GPU, e.g. --gpu_max_util=50");
}

// --nnodes=MIN:MAX: an elastic job, whose node ranks the rendezvous assigns.
void parseElasticRange(const cxxopts::ParseResult& parsed, const std::string& nnodesText, size_t colon,
                       LaunchOptions& launch) {
  ElasticOptions& elastic = launch.elastic;
  elastic.enabled = true;
  elastic.minNodes = parseInt("nnodes", nnodesText.substr(0, colon), 0, 65536,
                              "MIN:MAX, the fewest and most nodes of an elastic job, e.g. --nnodes=1:4");
  elastic.maxNodes = parseInt("nnodes", nnodesText.substr(colon + 1), 0, 65536,
                              "MIN:MAX, the fewest and most nodes of an elastic job, e.g. --nnodes=1:4");
  if (elastic.minNodes < 1) {
    DDP_THROW(ConfigError, "--nnodes=", nnodesText, ": an elastic job needs at least one node; give MIN >= 1, "
              "e.g. --nnodes=1:", std::max(elastic.maxNodes, 2));
  }
  if (elastic.minNodes > elastic.maxNodes) {
    DDP_THROW(ConfigError, "--nnodes=", nnodesText, ": MIN ", elastic.minNodes, " is more than MAX ",
              elastic.maxNodes, "; give MIN:MAX with MIN <= MAX, e.g. --nnodes=", elastic.maxNodes, ":",
              elastic.minNodes);
  }
  if (parsed.count("node_rank") != 0) {
    DDP_THROW(ConfigError, "--node_rank with --nnodes=", nnodesText, ": in an elastic job the rendezvous "
              "assigns the node ranks (anew in each round); drop --node_rank");
  }
  launch.nnodes = elastic.maxNodes;
}

// --nnodes: N nodes, or MIN:MAX for an elastic job.
void parseNodeCount(const cxxopts::ParseResult& parsed, const std::string& nnodesText, LaunchOptions& launch) {
  if (const size_t colon = nnodesText.find(':'); colon != std::string::npos) {
    parseElasticRange(parsed, nnodesText, colon, launch);
  } else {
    launch.nnodes = parseInt("nnodes", nnodesText, 1, 65536, "the number of nodes in the job, e.g. --nnodes=2");
  }
}

// The id is part of the store's keys ("elastic/<id>/..."): plain characters only.
void checkRdzvId(const std::string& id) {
  const bool plain = !id.empty() && id.size() <= 128 &&
                     id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") ==
                         std::string::npos;
  if (!plain) {
    DDP_THROW(ConfigError, "--rdzv_id '", id,
              "': give 1 to 128 letters, digits, '_', '.' or '-', e.g. --rdzv_id=$SLURM_JOB_ID");
  }
}

// The --rdzv_* and heartbeat flags, which only an elastic job takes (--rdzv_id, in a fixed job, is
// the workers' TORCHELASTIC_RUN_ID, as in torchrun). --rdzv_conf first: the flags override it.
void parseElasticTuning(const cxxopts::ParseResult& parsed, const std::string& nnodesText, ElasticOptions& elastic) {
  for (const char* flag : {"rdzv_last_call_s", "heartbeat_timeout_s", "rdzv_timeout_s"}) {
    if (parsed.count(flag) != 0 && !elastic.enabled) {
      DDP_THROW(ConfigError, "--", flag, " is for elastic jobs, but --nnodes=", nnodesText,
                " is a fixed number of nodes; give --nnodes=MIN:MAX or drop --", flag);
    }
  }
  if (parsed.count("rdzv_conf") != 0 && elastic.enabled) torchrun::applyRdzvConf(parsed["rdzv_conf"].as<std::string>(), elastic);
  if (parsed.count("rdzv_id") != 0) {
    elastic.rdzvId = parsed["rdzv_id"].as<std::string>();
    checkRdzvId(elastic.rdzvId);
  }
  if (parsed.count("rdzv_last_call_s") != 0) {
    elastic.lastCallS = parseSeconds("rdzv_last_call_s", parsed["rdzv_last_call_s"].as<std::string>(), "30");
  }
  if (parsed.count("heartbeat_timeout_s") != 0) {
    elastic.heartbeatTimeoutS =
        parseSeconds("heartbeat_timeout_s", parsed["heartbeat_timeout_s"].as<std::string>(), "30");
    if (elastic.heartbeatTimeoutS < 0.5) {
      DDP_THROW(ConfigError, "--heartbeat_timeout_s=", elastic.heartbeatTimeoutS,
                " is too short to tell a busy node from a lost one; give at least 0.5, e.g. 30");
    }
  }
  if (parsed.count("rdzv_timeout_s") != 0) {
    elastic.rdzvTimeoutS = parseSeconds("rdzv_timeout_s", parsed["rdzv_timeout_s"].as<std::string>(), "600");
  }
  if (elastic.enabled && elastic.lastCallS >= elastic.rdzvTimeoutS) {
    DDP_THROW(ConfigError, "--rdzv_last_call_s=", elastic.lastCallS, " is not shorter than --rdzv_timeout_s=",
              elastic.rdzvTimeoutS, ", so no round could close before it times out; shorten the first or "
              "lengthen the second");
  }
}

// --node_rank, within --nnodes.
void parseNodeRank(const cxxopts::ParseResult& parsed, LaunchOptions& launch) {
  launch.nodeRank = parseInt("node_rank", parsed["node_rank"].as<std::string>(), 0, 65535,
                             "this node's rank, from 0 to nnodes-1");
  if (launch.nodeRank >= launch.nnodes) {
    DDP_THROW(ConfigError, "--node_rank ", launch.nodeRank, " is out of range for --nnodes ", launch.nnodes,
              ": give each node a distinct rank from 0 to ", launch.nnodes - 1);
  }
}

// The job's size as a whole, and --standalone against --nnodes.
void checkJobShape(const cxxopts::ParseResult& parsed, const std::string& nnodesText, const LaunchOptions& launch) {
  if (static_cast<long long>(launch.nnodes) * launch.nprocPerNode > INT_MAX) {
    DDP_THROW(ConfigError, "--nnodes ", launch.nnodes, " x --nproc_per_node ", launch.nprocPerNode,
              " workers is more than ddp-launch supports");
  }
  if (parsed["standalone"].as<bool>() && launch.elastic.enabled) {
    DDP_THROW(ConfigError, "--standalone runs a single-node job but --nnodes=", nnodesText,
              " is an elastic one; drop one of them");
  }
  if (parsed["standalone"].as<bool>() && launch.nnodes != 1) {
    DDP_THROW(ConfigError, "--standalone runs a single-node job but --nnodes is ", launch.nnodes,
              "; drop one of them");
  }
}

// "node1:29500" -> {"node1", "29500"}, "[v6]:port" -> {"v6", "port"}; the port may be empty, the
// host is empty when there is none.
std::pair<std::string, std::string> splitEndpoint(const std::string& endpoint) {
  std::string host = endpoint, port;
  if (!host.empty() && host.front() == '[') {  // [v6]:port
    const size_t close = host.find(']');
    if (close != std::string::npos && close + 1 < host.size() && host[close + 1] == ':') port = host.substr(close + 2);
    host = close == std::string::npos ? "" : host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos && host.find(':') == colon) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  return {host, port};
}

// torchrun's --rdzv_endpoint: the rendezvous host and port, ours being node 0's store.
void parseRdzvEndpoint(const cxxopts::ParseResult& parsed, LaunchOptions& launch) {
  const std::string endpoint = parsed["rdzv_endpoint"].as<std::string>();
  if (launch.masterAddrGiven || parsed.count("master_port") != 0) {
    DDP_THROW(ConfigError, "--rdzv_endpoint=", endpoint, " and --master_addr/--master_port both say where the "
              "rendezvous is; keep one");
  }
  const auto [host, port] = splitEndpoint(endpoint);
  if (host.empty()) {
    DDP_THROW(ConfigError, "--rdzv_endpoint='", endpoint, "': give HOST[:PORT], e.g. --rdzv_endpoint=node1:29500");
  }
  launch.masterAddr = host;
  launch.masterAddrGiven = true;
  if (!port.empty()) {
    const int number = parseInt("rdzv_endpoint", port, 0, 65535,
                                "HOST[:PORT] with a TCP port, e.g. --rdzv_endpoint=node1:29500");
    // torchrun's single-node recipe, --rdzv_endpoint=localhost:0: a free port.
    if (number == 0 && launch.nnodes > 1) {
      DDP_THROW(ConfigError, "--rdzv_endpoint=", endpoint, ": port 0 (pick a free one) only works with --nnodes=1: "
                "every node must agree on the port, so give one, e.g. --rdzv_endpoint=", host, ":", kDefaultMultiNodePort);
    }
    if (number != 0) launch.masterPort = number;
  }
}

// Where rank 0 listens: --master_addr and --master_port, or --rdzv_endpoint.
void parseMasterAddress(const cxxopts::ParseResult& parsed, LaunchOptions& launch) {
  launch.masterAddrGiven = parsed.count("master_addr") != 0;
  launch.masterAddr = parsed["master_addr"].as<std::string>();
  if (launch.masterAddr.empty()) {
    DDP_THROW(ConfigError, "--master_addr is empty: give the host of rank 0, e.g. --master_addr=10.0.0.1");
  }
  if (parsed.count("rdzv_endpoint") != 0) parseRdzvEndpoint(parsed, launch);
  if (parsed.count("master_port") != 0) {
    const int port = parseInt("master_port", parsed["master_port"].as<std::string>(), 0, 65535,
                              "the TCP port rank 0 listens on, e.g. --master_port=29500");
    if (port == 0 && launch.nnodes > 1) {
      DDP_THROW(ConfigError, "--master_port=0 (pick a free port) only works with --nnodes=1: every node "
                "must agree on the port, so give one, e.g. --master_port=", kDefaultMultiNodePort);
    }
    if (port != 0) launch.masterPort = port;
  }
}

// --use_env[=BOOL] and its negation --no_use_env.
bool parseUseEnv(const cxxopts::ParseResult& parsed) {
  const bool useEnvGiven = parsed.count("use_env") != 0;
  const bool useEnv = parseBool("use_env", parsed["use_env"].as<std::string>());
  const bool noUseEnv = parsed["no_use_env"].as<bool>();
  if (useEnvGiven && noUseEnv && useEnv) {
    DDP_THROW(ConfigError, "--use_env and --no_use_env contradict each other; keep one");
  }
  return useEnv && !noUseEnv;
}

// How workers are stopped and restarted: the grace periods and --max_restarts.
void parseSupervision(const cxxopts::ParseResult& parsed, LaunchOptions& launch) {
  launch.shutdownGraceS = parseSeconds("shutdown_grace_s", parsed["shutdown_grace_s"].as<std::string>(), "5");
  const std::string earlyExitText = parsed["early_exit_grace_s"].as<std::string>();
  if (earlyExitText == "off") {
    launch.earlyExitGraceS.reset();
  } else {
    launch.earlyExitGraceS = parseSeconds("early_exit_grace_s", earlyExitText, "30 (or off)");
  }
  launch.maxRestarts = parseInt("max_restarts", parsed["max_restarts"].as<std::string>(), 0, kMaxRestartsLimit,
                                "how often to restart the group after a failure, e.g. --max_restarts=3");
}

// Where the workers' output goes: --log_dir and --tee.
void parseOutput(const cxxopts::ParseResult& parsed, LaunchOptions& launch) {
  readNonEmpty(parsed, "log_dir", launch.logDir,
               "--log_dir is empty: give a directory for the per-rank logs, e.g. --log_dir=logs");
  launch.tee = parsed.count("tee") != 0 && torchrun::streamsOfEveryRank("tee", parsed["tee"].as<std::string>());
  const bool redirects =
      parsed.count("redirects") != 0 && torchrun::streamsOfEveryRank("redirects", parsed["redirects"].as<std::string>());
  // As torchrun: without --log_dir the files go to a fresh temporary directory.
  launch.logDirTemporary = (redirects || launch.tee) && launch.logDir.empty();
}

// --rdzv_backend: static (node ranks given) or c10d, where the rendezvous numbers the nodes: for
// us an elastic job of exactly --nnodes nodes (torchrun's c10d is its elastic machinery too).
// Returns whether it is c10d; a single-node c10d job is a plain single-node job.
bool parseRdzvBackend(const cxxopts::ParseResult& parsed, LaunchOptions& launch) {
  const std::string backend = parsed["rdzv_backend"].as<std::string>();
  if (backend == "etcd" || backend == "etcd-v2") {
    DDP_THROW(ConfigError, "--rdzv_backend=", backend, ": ddp-launch meets at its own authenticated store, not "
              "etcd; use --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT (HOST: the first node)");
  }
  if (backend != "static" && backend != "c10d") {
    DDP_THROW(ConfigError, "--rdzv_backend=", backend, ": give static (each node passes --node_rank) or c10d "
              "(the rendezvous numbers the nodes)");
  }
  if (backend != "c10d") return false;
  if (!launch.elastic.enabled && launch.nnodes > 1) {
    launch.elastic.enabled = true;
    launch.elastic.minNodes = launch.elastic.maxNodes = launch.nnodes;
  }
  return true;
}

// torchrun's flags with a meaning here: --role, --shutdown_timeout, --monitor_interval, --start_method.
void parseTorchrunOnly(const cxxopts::ParseResult& parsed, LaunchOptions& launch) {
  launch.role = parsed["role"].as<std::string>();
  if (launch.role.empty()) DDP_THROW(ConfigError, "--role is empty: give the workers' role name, e.g. --role=trainer");
  if (parsed.count("monitor_interval") != 0) {
    parseSeconds("monitor_interval", parsed["monitor_interval"].as<std::string>(), "0.1");
  }
  if (parsed.count("start_method") != 0) {
    const std::string method = parsed["start_method"].as<std::string>();
    if (method != "spawn" && method != "fork" && method != "forkserver") {
      DDP_THROW(ConfigError, "--start_method=", method, ": torchrun takes spawn, fork or forkserver (ddp-launch "
                "starts every worker with fork and exec either way)");
    }
  }
  for (const char* flag : {"local_ranks_filter", "ranks_filter"}) {
    if (parsed.count(flag) == 0) continue;
    std::vector<int>& into = std::string(flag) == "ranks_filter" ? launch.ranksFilter : launch.localRanksFilter;
    std::istringstream in(parsed[flag].as<std::string>());
    for (std::string item; std::getline(in, item, ',');) {
      into.push_back(parseInt(flag, item, 0, 1 << 30, std::string("a comma-separated list of ranks, e.g. --") + flag + "=0,1"));
    }
    if (into.empty()) DDP_THROW(ConfigError, "--", flag, " is empty: give the ranks to show, e.g. --", flag, "=0");
  }
}

// A random (version 4) UUID, as Python's str(uuid.uuid4()): 8-4-4-4-12 lower-case hex digits.
std::string uuid4() {
  std::string bytes = crypto::randomBytes(16);
  bytes[6] = static_cast<char>((static_cast<unsigned char>(bytes[6]) & 0x0f) | 0x40);  // version 4
  bytes[8] = static_cast<char>((static_cast<unsigned char>(bytes[8]) & 0x3f) | 0x80);  // RFC 4122 variant
  std::string text = crypto::toHex(bytes);
  for (size_t at : {20, 16, 12, 8}) text.insert(at, 1, '-');  // from the back: earlier positions stay
  return text;
}

// Every flag's value into LaunchOptions; of two mistakes, the first in this order is reported.
LaunchOptions parseLaunchOptions(const cxxopts::ParseResult& parsed) {
  LaunchOptions launch;
  parseDevices(parsed, launch);
  const std::string nnodesText = parsed["nnodes"].as<std::string>();
  parseNodeCount(parsed, nnodesText, launch);
  const bool c10d = parseRdzvBackend(parsed, launch);
  parseElasticTuning(parsed, nnodesText, launch.elastic);
  if (!launch.elastic.enabled && parsed.count("rdzv_id") != 0) launch.runId = launch.elastic.rdzvId;
  // torchrun's run.py gives a single-node job a fresh rendezvous id, so TORCHELASTIC_RUN_ID tells runs
  // apart: with --standalone, and with the static backend and neither --master_port nor
  // --rdzv_endpoint. An explicit --rdzv_id stays (torchrun replaces it there with the uuid too).
  // Made by assignRunId() once the node count is final (srun may give it).
  launch.freshRunId = !launch.elastic.enabled && !c10d && parsed.count("rdzv_id") == 0 &&
                      (parsed["standalone"].as<bool>() ||
                       (parsed.count("master_port") == 0 && parsed.count("rdzv_endpoint") == 0));
  if (!c10d) parseNodeRank(parsed, launch);
  checkJobShape(parsed, nnodesText, launch);
  parseTorchrunOnly(parsed, launch);
  launch.nprocPerNodeGiven = parsed.count("nproc_per_node") != 0 && !launch.nprocAuto;
  launch.nnodesGiven = parsed.count("nnodes") != 0 || parsed["standalone"].as<bool>();
  launch.nodeRankGiven = parsed.count("node_rank") != 0;
  parseMasterAddress(parsed, launch);
  launch.useEnv = parseUseEnv(parsed);
  parseSupervision(parsed, launch);
  if (parsed.count("shutdown_timeout") != 0) {
    if (parsed.count("shutdown_grace_s") != 0) {
      DDP_THROW(ConfigError, "--shutdown_timeout is torchrun's name for --shutdown_grace_s; give one of them");
    }
    launch.shutdownGraceS = parseSeconds("shutdown_timeout", parsed["shutdown_timeout"].as<std::string>(), "30");
  } else if (const char* env = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
             env != nullptr && *env != '\0' && parsed.count("shutdown_grace_s") == 0) {
    // torchrun's default for --shutdown_timeout, where a job script may have set it.
    try {
      launch.shutdownGraceS = parseSeconds("shutdown_timeout", env, "30");
    } catch (const ConfigError&) {
      DDP_THROW(ConfigError, "environment: TORCH_ELASTIC_SHUTDOWN_TIMEOUT='", env, "' (torchrun's default for "
                "--shutdown_timeout) must be a number of seconds from 0 to ", kMaxGraceS, "; fix or unset it");
    }
  }
  parseOutput(parsed, launch);
  readNonEmpty(parsed, "rdzv_token_file", launch.rdzvTokenFile,
               "--rdzv_token_file is empty: give the path of the job's token file");
  readNonEmpty(parsed, "rdzv_bind", launch.rdzvBind,
               "--rdzv_bind is empty: give an address of this machine, or drop it to bind --master_addr");
  return launch;
}

}  // namespace
}  // namespace detail

std::string usageText() {
  std::string text = detail::makeOptions().help();
  text +=
      "\nEach worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,\n"
      "ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT and\n"
      "DDP_RESTART_COUNT (the attempt, 0 first), TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,\n"
      "TORCHELASTIC_ERROR_FILE (a failed rank's exception written there is shown), plus\n"
      "OMP_NUM_THREADS=1 when it is unset and nproc_per_node > 1. Output lines are prefixed with\n"
      "'[rank N] '. If a worker fails, the others get SIGTERM (SIGKILL after the grace period)\n"
      "and ddp-launch exits with the failed worker's code (128+signal if it was killed), after a\n"
      "summary of every rank (state and last output lines) on stderr. With --max_restarts=N the\n"
      "group is stopped and started again up to N times instead.\n"
      "\nExample:\n  ddp-launch --nproc_per_node=4 build/worker configs/fmnist_cnn_ddp.yaml train.epochs=2\n";
  return text;
}

CommandLine parseCommandLine(const std::vector<std::string>& args, const std::map<std::string, std::string>& environment) {
  cxxopts::Options options = detail::makeOptions();
  detail::SplitArgs split = detail::splitAtWorker(args, detail::describe(options));
  CommandLine result;
  const torchrun::FromEnvironment pet = torchrun::petArguments(detail::givenFlags(split.launcherArgs), environment);
  split.launcherArgs.insert(split.launcherArgs.begin(), pet.args.begin(), pet.args.end());
  if (!pet.note.empty()) result.notes.push_back(pet.note);
  const cxxopts::ParseResult parsed = detail::parseLauncherArgs(options, split.launcherArgs);

  if (parsed.count("help") != 0) {
    result.action = CommandAction::kHelp;
    result.text = usageText();
    return result;
  }
  if (parsed.count("version") != 0) {
    result.action = CommandAction::kVersion;
    result.text = std::string(detail::kProgram) + " " + DDP_LAUNCH_VERSION + "\n";
    return result;
  }
  result.options = detail::parseLaunchOptions(parsed);
  if (!split.worker || split.worker->empty()) {
    DDP_THROW(ConfigError, "missing WORKER: give the program to run after the options, e.g. "
              "ddp-launch --nproc_per_node=2 ./worker config.yaml (see --help)");
  }
  result.options.worker = *split.worker;
  result.options.workerArgs = split.workerArgs;
  torchrun::applyInterpreter(result.options, parsed["module"].as<bool>(), parsed["run_path"].as<bool>(),
                             parsed["no_python"].as<bool>());
  if (parsed["rdzv_backend"].as<std::string>() == "c10d" && parsed.count("node_rank") != 0) {
    result.notes.push_back("--node_rank is ignored with --rdzv_backend=c10d: the rendezvous numbers the nodes (as in torchrun)");
  }
  return result;
}

void assignRunId(LaunchOptions& options) {
  if (options.freshRunId && options.nnodes == 1) options.runId = detail::uuid4();
}

}  // namespace ddp::launcher
