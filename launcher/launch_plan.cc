#include "launcher/launch_plan.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/dir_lock.h"
#include "common/error.h"
#include "common/job_token.h"
#include "launcher/free_port.h"
#include "launcher/worker_path.h"

namespace ddp::launcher {
namespace {

// execvp's fallback when PATH is unset.
constexpr const char* kDefaultPath = "/bin:/usr/bin";
// Tries for a port other than the previous attempt's; the kernel rarely repeats one.
constexpr int kFreshPortTries = 8;

int choosePort(const LaunchOptions& options) {
  if (options.masterPort) return *options.masterPort;
  // Other nodes cannot learn a port we pick here, so only single-node jobs get a free one.
  if (options.nnodes > 1) return kDefaultMultiNodePort;
  return pickFreePort(options.masterAddr);
}

// The job's token: the user's file (--rdzv_token_file, else DDP_RDZV_TOKEN_FILE, else an inherited
// DDP_RDZV_TOKEN), or for a single-node job a fresh one. Multi-node jobs must share one.
std::string jobToken(const LaunchOptions& options, const EnvMap& inherited) {
  if (!options.rdzvTokenFile.empty()) return readTokenFile(options.rdzvTokenFile);
  if (auto file = inherited.find(kTokenFileEnv); file != inherited.end() && !file->second.empty()) {
    return readTokenFile(file->second);
  }
  if (auto token = inherited.find(kTokenEnv); token != inherited.end() && !token->second.empty()) {
    return checkedToken(token->second, kTokenEnv);
  }
  if (options.nnodes == 1) return newJobToken();
  DDP_THROW(ConfigError, "--nnodes=", options.nnodes,
            ": the nodes of a job share a secret token, so nothing else can join it; put one in a file "
            "every node can read (mode 600) and pass --rdzv_token_file=PATH on each node, e.g. "
            "(umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > ~/.ddp_token)");
}

// Workers that bind MASTER_PORT themselves (torch.distributed's rank 0 hosts its own TCPStore)
// must find it free: for them the launcher only picks a port.
bool workerServesItsOwnStore(const LaunchOptions& options) {
  return options.workerRunsPython || isPythonInterpreter(options.worker);
}

// One job per --log_dir: a second one would truncate the first's rank logs. Its own lock file, not
// the worker's .ddp-launch.lock (a --log_dir may be the worker's output.dir).
void lockLogDir(const std::string& dir) {
  const std::string file = ".ddp-launch-logs.lock";
  const std::string refused = dirLockRefusal(lockDirectory(dir, file), dir, file, "--log_dir");
  if (!refused.empty()) DDP_THROW(ConfigError, "--log_dir '", dir, "'", refused);
}

// mkdir -p, then a write check, so a bad --log_dir stops the launch before any worker starts.
void createLogDir(const std::string& dir) {
  std::string partial;
  size_t begin = 0;
  while (begin <= dir.size()) {
    size_t slash = dir.find('/', begin);
    if (slash == std::string::npos) slash = dir.size();
    partial = dir.substr(0, slash);
    begin = slash + 1;
    if (partial.empty() || partial == "." || partial == "..") continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      DDP_THROW(ConfigError, "--log_dir '", dir, "': cannot create '", partial, "' (", std::strerror(errno),
                "); give a directory you can write to");
    }
  }
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) {
    DDP_THROW(ConfigError, "--log_dir '", dir, "': ", std::strerror(errno), "; give a directory you can write to");
  }
  if (!S_ISDIR(info.st_mode)) {
    DDP_THROW(ConfigError, "--log_dir '", dir, "' exists but is not a directory; give a directory path");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    DDP_THROW(ConfigError, "--log_dir '", dir, "' is not writable (", std::strerror(errno),
              "); give a directory you can write to");
  }
}

}  // namespace

LaunchPlan makeLaunchPlan(const LaunchOptions& given, const EnvMap& inherited) {
  LaunchPlan plan;
  const auto path = inherited.find("PATH");
  const std::string workerPath =
      resolveWorkerPath(given.worker, path != inherited.end() ? path->second : kDefaultPath);
  LaunchOptions options = given;
  options.workerRunsPython = workerRunsPython(given, workerPath);
  const std::string token = jobToken(options, inherited);
  plan.masterAddr = options.masterAddr;
  plan.portPicked = !options.masterPort && options.nnodes == 1;
  if (options.nodeRank == 0 && !workerServesItsOwnStore(options)) {
    // Taken now and kept: nothing can take the port between this check and rank 0 serving it.
    plan.storeBindAddr = options.rdzvBind.empty() ? options.masterAddr : options.rdzvBind;
    const int port = options.masterPort ? *options.masterPort : options.nnodes > 1 ? kDefaultMultiNodePort : 0;
    plan.storeSocket = std::make_shared<ListenSocket>(plan.storeBindAddr, port);
    plan.masterPort = plan.storeSocket->port();
  } else {
    plan.masterPort = choosePort(options);
  }
  plan.shutdownGraceS = options.shutdownGraceS;
  plan.maxRestarts = options.maxRestarts;
  plan.tee = options.tee;
  if (!options.localRanksFilter.empty() || !options.ranksFilter.empty()) {
    for (int localRank = 0; localRank < options.nprocPerNode; ++localRank) {
      const int rank = options.globalRank(localRank);
      const auto& local = options.localRanksFilter;
      const auto& global = options.ranksFilter;
      if (std::find(local.begin(), local.end(), localRank) != local.end() ||
          std::find(global.begin(), global.end(), rank) != global.end()) {
        plan.consoleRanks.push_back(rank);
      }
    }
    if (plan.consoleRanks.empty()) {
      spdlog::info("--local_ranks_filter/--ranks_filter: none of this node's ranks is shown on the console");
      plan.consoleRanks.push_back(-1);  // none
    }
  }
  if (!options.logDir.empty()) {
    createLogDir(options.logDir);
    lockLogDir(options.logDir);
    plan.logDir = options.logDir;
  }
  if (shouldDefaultOmpThreads(options, inherited)) {
    spdlog::info(
        "setting OMP_NUM_THREADS=1 for each of the {} workers (it was unset) so they do not "
        "oversubscribe the CPU cores; set it yourself to tune it",
        options.nprocPerNode);
  }
  for (int localRank = 0; localRank < options.nprocPerNode; ++localRank) {
    WorkerCommand command;
    command.path = workerPath;
    command.args = workerArguments(options, localRank);
    command.env = workerEnvironment(options, localRank, plan.masterPort, inherited);
    command.env[kTokenEnv] = token;  // the environment, never argv: only this user can read it
    if (plan.storeSocket && options.globalRank(localRank) == 0) {
      command.inheritFd = plan.storeSocket->fd();
      command.env[kStoreFdEnv] = std::to_string(command.inheritFd);
    }
    plan.commands.push_back(std::move(command));
    plan.ranks.push_back(options.globalRank(localRank));
  }
  return plan;
}

LaunchPlan restartPlan(const LaunchPlan& previous) {
  LaunchPlan plan = previous;
  ++plan.attempt;
  if (plan.portPicked && plan.storeSocket) {
    // The old socket is still bound, so the kernel picks another port.
    plan.storeSocket = std::make_shared<ListenSocket>(plan.storeBindAddr, 0);
    plan.masterPort = plan.storeSocket->port();
  } else if (plan.portPicked) {
    for (int tries = 0; tries < kFreshPortTries && plan.masterPort == previous.masterPort; ++tries) {
      plan.masterPort = pickFreePort(plan.masterAddr);
    }
  }
  const std::string attempt = std::to_string(plan.attempt);
  for (WorkerCommand& command : plan.commands) {
    command.env["TORCHELASTIC_RESTART_COUNT"] = attempt;
    command.env["DDP_RESTART_COUNT"] = attempt;
    command.env["MASTER_PORT"] = std::to_string(plan.masterPort);
    if (command.inheritFd >= 0) {
      command.inheritFd = plan.storeSocket->fd();
      command.env[kStoreFdEnv] = std::to_string(command.inheritFd);
    }
  }
  return plan;
}

std::string rankLogPath(const LaunchPlan& plan, int rank) {
  const std::string name = "rank_" + std::to_string(rank) + ".log";
  if (plan.maxRestarts == 0 && !plan.elastic) return plan.logDir + "/" + name;
  return plan.logDir + "/attempt_" + std::to_string(plan.attempt) + "/" + name;
}

}  // namespace ddp::launcher
