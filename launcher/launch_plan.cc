#include "launcher/launch_plan.h"

#include <spdlog/spdlog.h>

#include "launcher/free_port.h"
#include "launcher/worker_path.h"

namespace ddp::launcher {
namespace {

// execvp's fallback when PATH is unset.
constexpr const char* kDefaultPath = "/bin:/usr/bin";

int choosePort(const LaunchOptions& options) {
  if (options.masterPort) return *options.masterPort;
  // Other nodes cannot learn a port we pick here, so only single-node jobs get a free one.
  if (options.nnodes > 1) return kDefaultMultiNodePort;
  return pickFreePort(options.masterAddr);
}

}  // namespace

LaunchPlan makeLaunchPlan(const LaunchOptions& options, const EnvMap& inherited) {
  LaunchPlan plan;
  const auto path = inherited.find("PATH");
  const std::string workerPath =
      resolveWorkerPath(options.worker, path != inherited.end() ? path->second : kDefaultPath);
  plan.masterPort = choosePort(options);
  plan.shutdownGraceS = options.shutdownGraceS;
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

}  // namespace ddp::launcher
