// ddp-launch: starts one worker per device with the torchrun environment contract.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <csignal>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/temp_dir.h"
#include "launcher/elastic.h"
#include "launcher/gpu_launch.h"
#include "launcher/launch_options.h"
#include "launcher/launch_plan.h"
#include "launcher/master_address.h"
#include "launcher/slurm_step.h"
#include "launcher/torchrun_compat.h"
#include "launcher/worker_env.h"
#include "launcher/worker_supervisor.h"

namespace {

// How long a node other than node 0 waits for --master_addr to resolve: 10 minutes, as long as
// an elastic round waits for its nodes (--rdzv_timeout_s).
constexpr double kMasterAddressWaitS = 600;

// --tee/--redirects without --log_dir: a new $TMPDIR/ddp-launch-logs-XXXXXX (torchrun's
// tempfile.mkdtemp), removed again if the job ends before anything is written there.
struct TemporaryLogDir {
  std::string dir;
  std::string make() {
    std::string pattern = ddp::temporaryRoot() + "/ddp-launch-logs-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      DDP_THROW(ddp::ConfigError, "--tee/--redirects without --log_dir: cannot make a log directory like ", pattern,
                " (", std::strerror(errno), "); give --log_dir=DIR");
    }
    dir = pattern;
    spdlog::info("--tee/--redirects without --log_dir: the rank logs go to {} (a new directory, as torchrun's)", dir);
    return dir;
  }
  ~TemporaryLogDir() {
    if (!dir.empty()) ::rmdir(dir.c_str());  // fails, and keeps it, once it holds anything
  }
};

// Bad command line or environment; nothing was started.
constexpr int kUsageExitCode = 2;
// The launcher itself broke (not the user's input, not a worker).
constexpr int kInternalErrorExitCode = 1;

// fds 0-2 closed by the caller (`ddp-launch ... >&-`): the next file opened would take one, and the
// store's listening socket became "stdout" (rank 0: DDP_STORE_FD=1 is not a listening TCP socket;
// output written into it). /dev/null holds each closed one before anything else is opened.
void holdStandardFds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int null = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);  // the lowest free fd: this one
    if (null >= 0 && null != fd) {
      ::dup2(null, fd);
      ::close(null);
    }
  }
}

void setUpLogging() {
  auto logger = spdlog::stderr_logger_mt("ddp-launch");
  logger->set_pattern("ddp-launch: %v");
  spdlog::set_default_logger(logger);
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug shows each worker's pid and exit
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ddp::launcher;
  holdStandardFds();
  setUpLogging();
  // A closed stdout must not kill the launcher and orphan the job; the relay sees EPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    const EnvMap environment = currentEnvironment();
    const CommandLine command = parseCommandLine(std::vector<std::string>(argv + 1, argv + argc), environment);
    if (command.action != CommandAction::kRun) {
      std::fputs(command.text.c_str(), stdout);
      return 0;
    }
    for (const std::string& note : command.notes) spdlog::info("{}", note);
    LaunchOptions options = command.options;
    options.consoleIsTerminal =
        ::isatty(STDOUT_FILENO) == 1 && ((options.logDir.empty() && !options.logDirTemporary) || options.tee);
    if (const std::string derived = applySrunStep(options, environment); !derived.empty()) {
      spdlog::info("{}", derived);
      // The step decided the worker count: --nproc_per_node=auto means Slurm's, not ours.
      if (derived.find("--nproc_per_node") != std::string::npos) options.nprocAuto = false;
    }
    if (const std::string gpus = resolveGpus(options, environment); !gpus.empty()) {
      std::istringstream lines(gpus);
      for (std::string line; std::getline(lines, line);) spdlog::info("{}", line);
    }
    checkSrunLayout(options, environment);
    assignRunId(options);
    torchrun::checkInheritedWorld(options, environment);
    // Node 0 runs rank 0: its address must resolve now. Another node (any node of an elastic job,
    // whose rendezvous host is --rdzv_endpoint's) may start before that pod has its DNS name: it
    // waits, as torchrun's agent retries, once everything else about the job is checked.
    const bool otherNode = options.nodeRank > 0 || options.elastic.enabled;
    if (!otherNode) checkMasterAddress(options.masterAddr);
    SupervisionOptions supervision;
    supervision.earlyExitGraceS = options.earlyExitGraceS;
    TemporaryLogDir temporaryLogs;  // after every check that can refuse the job: none is left behind then
    if (options.logDirTemporary) options.logDir = temporaryLogs.make();
    if (options.elastic.enabled) {
      checkMasterAddress(options.masterAddr, options.elastic.rdzvTimeoutS);
      return runElastic(options, environment, supervision);
    }
    const LaunchPlan plan = makeLaunchPlan(options, environment);
    if (otherNode) checkMasterAddress(options.masterAddr, kMasterAddressWaitS);
    return runWorkers(plan, supervision);
  } catch (const ddp::ConfigError& error) {
    spdlog::error("{}", error.what());
    return kUsageExitCode;
  } catch (const std::exception& error) {
    spdlog::error("internal error: {}", error.what());
    return kInternalErrorExitCode;
  }
}
