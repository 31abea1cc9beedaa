#include "launcher/launch_plan.h"

#include <cerrno>
#include <cstring>

#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/error.h"
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

LaunchPlan makeLaunchPlan(const LaunchOptions& options, const EnvMap& inherited) {
  LaunchPlan plan;
  const auto path = inherited.find("PATH");
  const std::string workerPath =
      resolveWorkerPath(options.worker, path != inherited.end() ? path->second : kDefaultPath);
  plan.masterPort = choosePort(options);
  plan.portPicked = !options.masterPort && options.nnodes == 1;
  plan.masterAddr = options.masterAddr;
  plan.shutdownGraceS = options.shutdownGraceS;
  plan.maxRestarts = options.maxRestarts;
  plan.tee = options.tee;
  if (!options.logDir.empty()) {
    createLogDir(options.logDir);
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
    plan.commands.push_back(std::move(command));
    plan.ranks.push_back(options.globalRank(localRank));
  }
  return plan;
}

LaunchPlan restartPlan(const LaunchPlan& previous) {
  LaunchPlan plan = previous;
  ++plan.attempt;
  if (plan.portPicked) {
    for (int tries = 0; tries < kFreshPortTries && plan.masterPort == previous.masterPort; ++tries) {
      plan.masterPort = pickFreePort(plan.masterAddr);
    }
  }
  const std::string attempt = std::to_string(plan.attempt);
  for (WorkerCommand& command : plan.commands) {
    command.env["TORCHELASTIC_RESTART_COUNT"] = attempt;
    command.env["DDP_RESTART_COUNT"] = attempt;
    command.env["MASTER_PORT"] = std::to_string(plan.masterPort);
  }
  return plan;
}

std::string rankLogPath(const LaunchPlan& plan, int rank) {
  const std::string name = "rank_" + std::to_string(rank) + ".log";
  if (plan.maxRestarts == 0) return plan.logDir + "/" + name;
  return plan.logDir + "/attempt_" + std::to_string(plan.attempt) + "/" + name;
}

}  // namespace ddp::launcher
