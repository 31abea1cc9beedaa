// The ddp-launch command line: torchrun's flags, filled into LaunchOptions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

/// Largest --shutdown_grace_s and --early_exit_grace_s: a day is already no grace period.
constexpr double kMaxGraceS = 86400;

/// Port every node uses when a multi-node job names none (torchrun's default).
constexpr int kDefaultMultiNodePort = 29500;

/// An elastic job's settings (--nnodes=MIN:MAX); see launcher/elastic.h.
struct ElasticOptions {
  bool enabled = false;           // --nnodes was MIN:MAX
  int minNodes = 1;
  int maxNodes = 1;
  std::string rdzvId = "default"; // --rdzv_id: the job's id, so jobs sharing a store stay apart
  double lastCallS = 30;          // --rdzv_last_call_s: wait for more nodes once MIN are in
  double heartbeatTimeoutS = 30;  // --heartbeat_timeout_s: a node silent this long has left
  double rdzvTimeoutS = 600;      // --rdzv_timeout_s: a round without MIN nodes after this ends the job
};

/// Everything the command line decides. Parsing fills it; nothing else reads argv.
struct LaunchOptions {
  int nprocPerNode = 1;                  // --nproc_per_node: workers on this node
  bool nprocAuto = false;                // --nproc_per_node=auto|gpu|cpu: counted later (resolveGpus)
  std::string nprocWord;                 // which of auto, gpu, cpu (torchrun's words)
  std::string gpus;                      // --gpus auto[:N] | 2,3; empty: not given
  int gpuMaxUsedMb = 1024;               // --gpu_max_used_mb: auto skips GPUs with more memory in use
  int gpuMaxUtil = 30;                   // --gpu_max_util: ... or busier than this (percent)
  // Not a flag: what --gpus chose; non-empty: every worker gets it as CUDA_VISIBLE_DEVICES, with
  // CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers GPUs as nvidia-smi does.
  std::string cudaVisibleDevices;
  // Not a flag: set by makeLaunchPlan (workerRunsPython): the worker runs Python, whatever its name.
  bool workerRunsPython = false;
  int nnodes = 1;                        // --nnodes: nodes in the job
  int nodeRank = 0;                      // --node_rank: this node, 0 <= node_rank < nnodes
  std::string masterAddr = "127.0.0.1";  // --master_addr: where rank 0 listens
  // --master_port: unset (or 0) picks a free port when nnodes == 1, else kDefaultMultiNodePort.
  std::optional<int> masterPort;
  bool useEnv = true;                    // --use_env; off also passes --local_rank=N first
  double shutdownGraceS = 5.0;           // --shutdown_grace_s: SIGTERM, then SIGKILL after this
  // --early_exit_grace_s: a rank that exits 0 while others still run this long after is a
  // failure (it left them waiting in a collective); nullopt (--early_exit_grace_s=off) = never.
  std::optional<double> earlyExitGraceS = 30.0;
  int maxRestarts = 0;                   // --max_restarts: restarts of the whole group after a failure
  ElasticOptions elastic;                // --nnodes=MIN:MAX and the --rdzv_* flags of elastic jobs
  std::string logDir;                    // --log_dir: empty = worker output to the console only
  // --tee/--redirects without --log_dir: the logs go to a new temporary directory (torchrun's
  // tempfile.mkdtemp), made by the launcher before it starts (makeTemporaryLogDir).
  bool logDirTemporary = false;
  bool tee = false;                      // --tee (torchrun: --tee=3): with --log_dir, the console gets the lines too
  std::string role = "default";          // --role: the workers' ROLE_NAME
  // --local_ranks_filter / --ranks_filter: the console shows only these ranks (empty: all).
  std::vector<int> localRanksFilter;
  std::vector<int> ranksFilter;
  // --rdzv_id in a fixed job: the workers' TORCHELASTIC_RUN_ID (torchrun's default "none"; a fresh
  // uuid4 for a single-node job when freshRunId, see assignRunId()).
  std::string runId = "none";
  bool freshRunId = false;
  // --rdzv_token_file: the job's token for multi-node jobs (single-node jobs make their own).
  std::string rdzvTokenFile;
  // --rdzv_bind: where node 0 binds the store; empty: masterAddr.
  std::string rdzvBind;
  // Which of the above the command line set explicitly (under srun the rest come from Slurm).
  bool nprocPerNodeGiven = false;
  bool nnodesGiven = false;
  bool nodeRankGiven = false;
  bool masterAddrGiven = false;
  // Not a flag: the launcher's stdout is a terminal and gets the workers' output (no --log_dir, or
  // --tee), so rank 0 may draw a live progress bar (DDP_PROGRESS=bar).
  bool consoleIsTerminal = false;
  std::string worker;                    // WORKER, as given (resolved later)
  std::vector<std::string> workerArgs;   // everything after WORKER, untouched

  int worldSize() const { return nnodes * nprocPerNode; }
  /// Global rank of the worker with this local rank on this node.
  int globalRank(int localRank) const { return nodeRank * nprocPerNode + localRank; }
};

/// What the command line asks for.
enum class CommandAction {
  kRun,      // start the workers
  kHelp,     // print `text` (usage) and exit 0
  kVersion,  // print `text` (version) and exit 0
};

/// The parsed command line.
struct CommandLine {
  CommandAction action = CommandAction::kRun;
  LaunchOptions options;  // valid when action == kRun
  std::string text;       // help or version text for the other actions
  // Lines to print at start-up: what came from torchrun's PET_* variables, what was ignored.
  std::vector<std::string> notes;
};

/// Parses the arguments after argv[0]. Option names may use '-' or '_'
/// (`--nproc-per-node` == `--nproc_per_node`); the first non-option argument is
/// WORKER and everything after it goes to the worker untouched.
/// Throws ddp::ConfigError with a one-line message that says how to fix the input.
/// `environment`: torchrun's PET_<FLAG> variables (a Kubeflow PyTorchJob sets them) are the
/// defaults of the flags the command line does not give, as in torchrun.
CommandLine parseCommandLine(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& environment = {});

/// The --help text.
std::string usageText();

/// torchrun's TORCHELASTIC_RUN_ID for a single-node job (freshRunId): a fresh uuid4, once the node
/// count is final (after the srun step's); otherwise runId stays.
void assignRunId(LaunchOptions& options);

}  // namespace ddp::launcher
