#include "worker/train/stop_signal.h"

#include <csignal>

#include <atomic>

namespace ddp::worker {
namespace {

std::atomic<int> gStopSignal{0};

extern "C" void onStopSignal(int sig) {
  int expected = 0;
  if (!gStopSignal.compare_exchange_strong(expected, sig)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace

void installStopSignalHandlers() {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction action = {};
    action.sa_handler = onStopSignal;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
}

int stopSignal() { return gStopSignal.load(); }

}  // namespace ddp::worker
