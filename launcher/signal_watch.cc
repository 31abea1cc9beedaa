#include "launcher/signal_watch.h"

#include <algorithm>
#include <cerrno>
#include <ctime>

#include <pthread.h>
#include <unistd.h>

#include "common/error.h"

namespace ddp::launcher {

SignalWatch::SignalWatch() {
  // An inherited SIG_IGN for SIGCHLD would make the kernel reap workers behind our back.
  ::signal(SIGCHLD, SIG_DFL);
  sigemptyset(&watched_);
  sigaddset(&watched_, SIGCHLD);
  // SIGUSR1/SIGUSR2: Slurm's warning before the time limit (#SBATCH --signal=USR1@120) and other
  // schedulers' preemption notice; forwarded like SIGTERM (torchrun: --signals_to_handle).
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) {
    struct sigaction current {};
    ::sigaction(signal, nullptr, &current);
    if (current.sa_handler == SIG_IGN) continue;
    forwarded_.push_back(signal);
    sigaddset(&watched_, signal);
  }
  // SIGTSTP (Ctrl-Z): taken here so the workers stop with the launcher (not forwarded as a stop).
  struct sigaction tstp {};
  ::sigaction(SIGTSTP, nullptr, &tstp);
  if (tstp.sa_handler != SIG_IGN) sigaddset(&watched_, SIGTSTP);
  const int status = ::pthread_sigmask(SIG_BLOCK, &watched_, &previous_);
  DDP_ENFORCE(status == 0, "pthread_sigmask failed with ", status);
}

SignalWatch::~SignalWatch() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

int SignalWatch::wait(std::chrono::milliseconds timeout) {
  using std::chrono::duration_cast;
  const auto seconds = duration_cast<std::chrono::seconds>(timeout);
  timespec limit{};
  limit.tv_sec = static_cast<time_t>(seconds.count());
  limit.tv_nsec = static_cast<long>(duration_cast<std::chrono::nanoseconds>(timeout - seconds).count());
  const int signal = ::sigtimedwait(&watched_, nullptr, &limit);
  if (signal < 0) {
    DDP_ENFORCE(errno == EAGAIN || errno == EINTR, "sigtimedwait failed, errno ", errno);
    return 0;
  }
  return signal;
}

bool SignalWatch::suspendedOn(int signal) {
  if (signal != SIGTSTP) return false;
  ::kill(::getpid(), SIGSTOP);  // SIGTSTP itself is blocked here, taken by the watch
  return true;
}

bool SignalWatch::isForwarded(int signal) const {
  return std::find(forwarded_.begin(), forwarded_.end(), signal) != forwarded_.end();
}

}  // namespace ddp::launcher
