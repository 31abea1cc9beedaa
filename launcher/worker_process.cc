#include "launcher/worker_process.h"

#include <csignal>
#include <system_error>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/process/args.hpp>
#include <boost/process/child.hpp>
#include <boost/process/env.hpp>
#include <boost/process/environment.hpp>
#include <boost/process/exe.hpp>
#include <boost/process/extend.hpp>
#include <boost/process/io.hpp>
#include <boost/process/pipe.hpp>

#include "common/error.h"

namespace bp = boost::process;

namespace ddp::launcher {
namespace detail {
namespace {

// Runs between fork and exec, so only async-signal-safe calls.
struct WorkerExecSetup : bp::extend::handler {
  pid_t launcherPid;
  int inheritFd;
  int recorderFd;

  WorkerExecSetup(pid_t launcher, int keepFd, int ringFd) : launcherPid(launcher), inheritFd(keepFd), recorderFd(ringFd) {}

  template <typename Executor>
  void on_exec_setup(Executor& exec) const {
    // A session of its own (as torchrun's workers), so also a process group of its own (signals go to
    // -pid): not a background job of the launcher's terminal, where reading it (input(), pdb,
    // breakpoint()) stopped the worker with SIGTTIN and the job waited for ever.
    if (::setsid() < 0) fail(exec, "setsid() failed");
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(exec, "prctl(PR_SET_PDEATHSIG) failed");
    // The launcher may have died before prctl took effect; then no signal will come.
    if (::getppid() != launcherPid) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    if (inheritFd >= 0 && ::fcntl(inheritFd, F_SETFD, 0) != 0) fail(exec, "fcntl(F_SETFD) failed");
    if (recorderFd >= 0 && ::fcntl(recorderFd, F_SETFD, 0) != 0) fail(exec, "fcntl(F_SETFD) failed");
  }

  // Boost.Process does not reap a child whose exec failed.
  template <typename Executor>
  void on_error(Executor& exec, const std::error_code&) const {
    if (exec.pid > 0) {
      while (::waitpid(exec.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }

  template <typename Executor>
  static void fail(Executor& exec, const char* what) {
    exec.set_error(std::error_code(errno, std::system_category()), what);
    ::_exit(127);
  }
};

bp::pipe makePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    DDP_THROW(Error, "pipe2() failed: ", std::system_category().message(errno));
  }
  return bp::pipe(fds[0], fds[1]);
}

}  // namespace
}  // namespace detail

StartedWorker startWorker(const WorkerCommand& command) {
  bp::environment env;
  for (const auto& [name, value] : command.env) env[name] = value;

  // O_CLOEXEC on both ends: later workers must not inherit this worker's pipes, or
  // the launcher would never see EOF. dup2() onto 1 and 2 clears the flag in the child.
  bp::pipe out = detail::makePipe();
  bp::pipe err = detail::makePipe();
  std::error_code error;
  bp::child child(bp::exe = command.path, bp::args = command.args, env, bp::std_out > out, bp::std_err > err,
                  detail::WorkerExecSetup(::getpid(), command.inheritFd, command.recorderFd), error);
  if (error) {
    DDP_THROW(ConfigError, "could not start worker '", command.path, "': ", error.message(),
              "; is it a program for this machine (a script needs a #! line)?");
  }
  StartedWorker started;
  started.pid = child.id();
  // The launcher reaps workers itself with waitid(); the bp::child must not.
  child.detach();
  started.stdoutFd = out.native_source();
  started.stderrFd = err.native_source();
  out.assign_source(-1);
  err.assign_source(-1);
  return started;
}

}  // namespace ddp::launcher
