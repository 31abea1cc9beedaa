// Benchmarks of our comm layer, started by ddp-launch (one process per rank):
//   ddp_bench overlap HIDDEN(csv) BATCH STEPS  — step time: local only, standalone
//       all-reduce of all gradients, DDP (bucketed Reducer); hidden share.
//   ddp_bench collectives                      — nccl-tests-style all-reduce table + memcpy.
// Rank 0 prints JSON lines.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>

#include "comm/backend.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "comm/rendezvous.h"
#include "libddp/runtime/env.h"
#include "worker/models/models.h"

namespace {
using namespace ddp;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

std::unique_ptr<comm::Communicator> connect(int& rank, int& world) {
  rank = std::atoi(std::getenv("RANK"));
  world = std::atoi(std::getenv("WORLD_SIZE"));
  comm::RendezvousOptions rdv;
  rdv.masterAddr = std::getenv("MASTER_ADDR");
  rdv.masterPort = static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT")));
  rdv.rank = rank;
  rdv.worldSize = world;
  comm::ProcessGroupOptions pg;
  pg.rank = rank;
  pg.worldSize = world;
  // DDP_BENCH_BACKEND=gloo|shm (default gloo).
  const char* backend = std::getenv("DDP_BENCH_BACKEND");
  pg.backend = backend ? comm::parseBackend(backend) : comm::Backend::kGloo;
  c10::intrusive_ptr<c10d::Store> store;
  if (world > 1) store = comm::rendezvous(rdv);
  return comm::makeCommunicator(store, pg);
}

// Median seconds per step of `steps` steps after as many warm-up steps.
template <typename Step>
double medianStep(comm::Communicator& comm, int steps, Step&& step) {
  for (int i = 0; i < steps; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    comm.barrier();
    const auto t = Clock::now();
    step();
    times.push_back(seconds(t));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void overlap(comm::Communicator& comm, const std::string& hiddenCsv, int64_t batch, int steps) {
  worker::ModelConfig mc;
  mc.name = "mlp";
  mc.hidden.clear();
  std::stringstream in(hiddenCsv);
  for (std::string w; std::getline(in, w, ',');) mc.hidden.push_back(std::stoll(w));
  torch::manual_seed(0);
  auto model = worker::makeModel(mc, worker::InputSpec{});
  auto params = model.ptr()->parameters();
  std::vector<std::string> names;
  for (const auto& p : model.ptr()->named_parameters()) names.push_back(p.key());
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
  const double a = medianStep(comm, steps, local);
  at::Tensor flat = at::zeros({numel});
  const double b = medianStep(comm, steps, [&] { comm.allReduceSum(flat); });
  comm::Reducer reducer(comm, params, names);
  const double c = medianStep(comm, steps, [&] {
    for (auto& p : params) if (p.grad().defined()) p.grad().zero_();
    at::Tensor loss = torch::nn::functional::cross_entropy(model.forward(x), y);
    reducer.prepareForBackward({loss});
    loss.backward();
    sgd.step();
  });
  if (comm.rank() == 0) {
    std::cout << nlohmann::json{{"bench", "overlap"}, {"backend", comm.backendName()}, {"params", numel}, {"world", comm.size()},
                                {"local_s", a}, {"allreduce_s", b}, {"ddp_s", c},
                                {"hidden_share", (a + b - c) / b},
                                {"buckets", reducer.bucketIndices().size()}}.dump()
              << std::endl;
  }
}

void collectives(comm::Communicator& comm) {
  const int n = comm.size();
  for (int64_t bytes = 4 << 10; bytes <= (int64_t(256) << 20); bytes *= 4) {
    at::Tensor t = at::ones({bytes / 4});
    const int iters = bytes >= (64 << 20) ? 3 : bytes >= (1 << 20) ? 10 : 50;
    comm.allReduceSum(t);
    comm.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) comm.allReduceSum(t);
    const double s = seconds(start) / iters;
    at::Tensor dst = at::empty_like(t);
    const auto m = Clock::now();
    for (int i = 0; i < iters; ++i) dst.copy_(t);
    const double ms = seconds(m) / iters;
    const double algbw = bytes / s / 1e9;
    if (comm.rank() == 0) {
      std::cout << nlohmann::json{{"bench", "allreduce"}, {"backend", comm.backendName()}, {"bytes", bytes}, {"world", n},
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
    int rank = 0, world = 1;
    auto comm = connect(rank, world);
    const std::string what = argc > 1 ? argv[1] : "";
    if (what == "overlap" && argc == 5) {
      overlap(*comm, argv[2], std::stoll(argv[3]), std::stoi(argv[4]));
    } else if (what == "collectives") {
      collectives(*comm);
    } else {
      std::cerr << "usage: ddp_bench overlap HIDDEN BATCH STEPS | ddp_bench collectives\n";
      return 2;
    }
    comm->barrier();
  } catch (const std::exception& e) {
    std::cerr << "ddp_bench: " << e.what() << "\n";
    return 1;
  }
}
