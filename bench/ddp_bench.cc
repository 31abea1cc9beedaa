// Benchmarks of the library's process group and DDP engine, started by ddp-launch (one process
// per rank), through the public API (<ddp/ddp.h>) as a user's program would:
//   ddp_bench overlap HIDDEN(csv) BATCH STEPS  — step time: local only, standalone
//       all-reduce of all gradients, DDP (ddp::DdpEngine, bucketed); hidden share.
//   ddp_bench collectives                      — nccl-tests-style all-reduce table + memcpy.
// DDP_BENCH_BACKEND=gloo|shm (default gloo). Rank 0 prints JSON lines.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "ddp/ddp.h"
#include "worker/models/models.h"

namespace {
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

std::string benchBackend() {
  const char* backend = std::getenv("DDP_BENCH_BACKEND");
  return backend ? backend : "gloo";
}

ddp::ProcessGroup connect() {
  ddp::InitOptions options;
  const std::string name = benchBackend();
  const std::optional<ddp::Backend> backend = ddp::parseBackend(name);
  if (!backend) {
    std::fprintf(stderr, "ddp_bench: DDP_BENCH_BACKEND is '%s'; use gloo or shm\n", name.c_str());
    std::exit(2);
  }
  options.backend = *backend;
  options.device = "cpu";
  options.timeoutName = "ddp_bench's timeout";
  return ddp::initProcessGroup(options);
}

// How many buckets the engine reduces per backward: the default all-reduce, counted on the way.
class CountingHook : public ddp::CommHook {
 public:
  ddp::Work run(ddp::GradBucket& bucket, ddp::ProcessGroup& group) override {
    buckets = std::max(buckets, bucket.index() + 1);
    return inner_->run(bucket, group);
  }
  size_t buckets = 0;

 private:
  std::shared_ptr<ddp::CommHook> inner_ = ddp::allReduceHook();
};

// Median seconds per step of `steps` steps after as many warm-up steps.
template <typename Step>
double medianStep(ddp::ProcessGroup& group, int steps, Step&& step) {
  for (int i = 0; i < steps; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    group.barrier();
    const auto t = Clock::now();
    step();
    times.push_back(seconds(t));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void overlap(ddp::ProcessGroup& group, const std::string& hiddenCsv, int64_t batch, int steps) {
  ddp::worker::ModelConfig mc;
  mc.name = "mlp";
  mc.hidden.clear();
  std::stringstream in(hiddenCsv);
  for (std::string w; std::getline(in, w, ',');) mc.hidden.push_back(std::stoll(w));
  torch::manual_seed(0);
  auto model = ddp::worker::makeModel(mc, ddp::worker::InputSpec{});
  auto params = model.ptr()->parameters();
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  const at::Tensor x = at::randn({batch, 1, 28, 28});
  const at::Tensor y = at::randint(0, 10, {batch});
  int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  auto local = [&] {
    for (auto& p : params) if (p.grad().defined()) p.grad().zero_();
    torch::nn::functional::cross_entropy(model.forward(x), y).backward();
    sgd.step();
  };
  const double a = medianStep(group, steps, local);
  at::Tensor flat = at::zeros({numel});
  const double b = medianStep(group, steps, [&] { group.allReduce(flat); });
  // The bucket count, from one untimed backward of an engine with a counting hook.
  auto counter = std::make_shared<CountingHook>();
  {
    ddp::DdpOptions counting;
    counting.commHook = counter;
    ddp::DdpEngine engine(*model.ptr(), group, counting);
    engine.beforeForward();
    const at::Tensor out = model.forward(x);
    engine.afterForward({out});
    torch::nn::functional::cross_entropy(out, y).backward();
  }
  ddp::DdpEngine engine(*model.ptr(), group);
  const double c = medianStep(group, steps, [&] {
    for (auto& p : params) if (p.grad().defined()) p.grad().zero_();
    engine.beforeForward();
    const at::Tensor out = model.forward(x);
    engine.afterForward({out});
    torch::nn::functional::cross_entropy(out, y).backward();
    sgd.step();
  });
  if (group.rank() == 0) {
    std::cout << nlohmann::json{{"bench", "overlap"}, {"backend", benchBackend()}, {"params", numel},
                                {"world", group.size()}, {"local_s", a}, {"allreduce_s", b}, {"ddp_s", c},
                                {"hidden_share", (a + b - c) / b}, {"buckets", counter->buckets}}.dump()
              << std::endl;
  }
}

void collectives(ddp::ProcessGroup& group) {
  const int n = group.size();
  for (int64_t bytes = 4 << 10; bytes <= (int64_t(256) << 20); bytes *= 4) {
    at::Tensor t = at::ones({bytes / 4});
    const int iters = bytes >= (64 << 20) ? 3 : bytes >= (1 << 20) ? 10 : 50;
    group.allReduce(t);
    group.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) group.allReduce(t);
    const double s = seconds(start) / iters;
    at::Tensor dst = at::empty_like(t);
    const auto m = Clock::now();
    for (int i = 0; i < iters; ++i) dst.copy_(t);
    const double ms = seconds(m) / iters;
    const double algbw = bytes / s / 1e9;
    if (group.rank() == 0) {
      std::cout << nlohmann::json{{"bench", "allreduce"}, {"backend", benchBackend()}, {"bytes", bytes}, {"world", n},
                                  {"time_us", s * 1e6}, {"algbw_GBs", algbw},
                                  {"busbw_GBs", algbw * 2.0 * (n - 1) / n},
                                  {"memcpy_GBs", bytes / ms / 1e9}}.dump()
                << std::endl;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    at::set_num_threads(1);
    ddp::ProcessGroup group = connect();
    const std::string what = argc > 1 ? argv[1] : "";
    if (what == "overlap" && argc == 5) {
      overlap(group, argv[2], std::stoll(argv[3]), std::stoi(argv[4]));
    } else if (what == "collectives") {
      collectives(group);
    } else {
      std::cerr << "usage: ddp_bench overlap HIDDEN BATCH STEPS | ddp_bench collectives\n";
      return 2;
    }
    group.destroy();
  } catch (const std::exception& e) {
    std::cerr << "ddp_bench: " << e.what() << "\n";
    return 1;
  }
}
