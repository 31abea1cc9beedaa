// The flight recorder's cost per collective: Recorder::begin + Recorder::end, as every collective of
// a ddp::ProcessGroup pays it, timed over many calls on one thread and on two threads at once (DDP's
// reducer records from autograd's thread while the main thread records its own). Prints JSON lines.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/flight_recorder.h"

namespace {

double nsPerCollective(int threads, long calls) {
  auto& recorder = ddp::flight::Recorder::instance();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&recorder, calls, t] {
      for (long i = 1; i <= calls; ++i) {
        ddp::flight::Entry* e = recorder.begin(t, static_cast<uint64_t>(i), "all_reduce", "DDP gradients", "float", 1 << 20, -1);
        ddp::flight::Recorder::end(e, static_cast<uint64_t>(i), ddp::flight::State::kDone);
      }
    });
  }
  for (auto& th : pool) th.join();
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  return ns / static_cast<double>(calls);  // per collective on each thread
}

}  // namespace

int main() {
  const long calls = 5'000'000;
  nsPerCollective(1, calls / 10);  // warm-up
  for (int threads : {1, 2}) {
    std::printf("{\"threads\": %d, \"calls_per_thread\": %ld, \"ns_per_collective\": %.1f}\n", threads, calls,
                nsPerCollective(threads, calls));
  }
  return 0;
}
