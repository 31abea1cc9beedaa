#include "worker/train/stop_signal.h"

#include <time.h>

#include <csignal>

#include <atomic>

namespace ddp::worker {
namespace {

std::atomic<int> gStopSignal{0};
std::atomic<long long> gFirstAtMs{0};

// A repeat of the first signal within this long is the same request delivered twice: a scheduler
// that signals every process of the job (Slurm's scancel --signal, the time limit's SIGTERM) and
// the launcher forwarding its own copy. A later one (a second Ctrl-C) ends the worker at once.
constexpr long long kSameRequestMs = 2000;

long long nowMs() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return static_cast<long long>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
}

extern "C" void onStopSignal(int sig) {
  int expected = 0;
  if (gStopSignal.compare_exchange_strong(expected, sig)) {
    gFirstAtMs.store(nowMs());
    return;
  }
  if (expected == sig && nowMs() - gFirstAtMs.load() < kSameRequestMs) return;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void installStopSignalHandlers() {
  // SIGUSR1/SIGUSR2: Slurm's warning before the time limit (#SBATCH --signal=USR1@120), which
  // ddp-launch forwards: save at the step every rank agrees on and exit 128 + signal, for a requeue.
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) {
    struct sigaction action = {};
    action.sa_handler = onStopSignal;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
}

int stopSignal() { return gStopSignal.load(); }

}  // namespace ddp::worker
