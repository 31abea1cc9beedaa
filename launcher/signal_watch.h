// Taking SIGCHLD and the signals the launcher forwards synchronously, in one loop.
#pragma once

#include <chrono>
#include <vector>

#include <signal.h>

namespace ddp::launcher {

/// Blocks SIGCHLD, SIGTSTP (the supervisor stops the workers with the launcher) and the forwarded
/// signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) in the calling thread, so threads started later inherit the mask and the signals wait in the
/// queue for wait(). A forwarded signal that was ignored when the launcher started (nohup,
/// `cmd &` in a script) stays ignored and is not watched. Restores the mask on destruction.
/// Children must reset their mask before exec (startWorker does).
class SignalWatch {
 public:
  SignalWatch();
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  /// Waits up to `timeout` for a watched signal; returns it, or 0 on timeout.
  int wait(std::chrono::milliseconds timeout);

  /// The signals the launcher passes on to its workers, in the order it watches them.
  const std::vector<int>& forwarded() const { return forwarded_; }
  bool isForwarded(int signal) const;

  /// SIGTSTP (Ctrl-Z) where no worker runs (a restart's back-off, an elastic wait): stops the
  /// launcher as the signal's own action would, until SIGCONT (fg); true when `signal` was it.
  static bool suspendedOn(int signal);

 private:
  std::vector<int> forwarded_;
  sigset_t watched_;
  sigset_t previous_;
};

}  // namespace ddp::launcher
