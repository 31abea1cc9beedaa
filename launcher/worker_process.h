// Starting one worker process: own process group, parent-death signal, piped output.
#pragma once

#include <string>
#include <vector>

#include <sys/types.h>

#include "launcher/worker_env.h"

namespace ddp::launcher {

/// What to run for one worker.
struct WorkerCommand {
  std::string path;               // resolved program path (see resolveWorkerPath)
  std::vector<std::string> args;  // argv[1..]
  EnvMap env;                     // the complete environment
  int inheritFd = -1;             // a close-on-exec fd the worker keeps across exec (rank 0's store socket)
  int recorderFd = -1;            // another: the flight recorder's memfd (common/flight_recorder.h)
};

/// A started worker. Its pid is also its process-group id. The caller owns the fds.
struct StartedWorker {
  pid_t pid = -1;
  int stdoutFd = -1;  // read end of the worker's stdout pipe (O_CLOEXEC)
  int stderrFd = -1;  // read end of the worker's stderr pipe (O_CLOEXEC)
};

/// Starts `command` with Boost.Process. In the child, before exec: setsid() so the
/// launcher can signal the worker and everything it forks as one group (and terminal ^C
/// reaches only the launcher); PR_SET_PDEATHSIG = SIGKILL so the worker dies with the
/// launcher; an empty signal mask and default SIGPIPE, undoing the launcher's own.
/// Returns once the child has exec'd. Throws ddp::ConfigError if exec fails.
///
/// Call it from the thread that outlives the worker: the parent-death signal fires when
/// the forking *thread* exits, not the process.
StartedWorker startWorker(const WorkerCommand& command);

}  // namespace ddp::launcher
