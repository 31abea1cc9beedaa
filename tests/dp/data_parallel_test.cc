// Tier 2: DataParallel on CPU replicas against a plain single-process LibTorch
// step on the same full batch (one model, one forward, one mean loss, SGD).
#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "worker/dp/data_parallel.h"
#include "ddp/state_dict.h"
#include "worker/models/models.h"

namespace ddp {
namespace {

using worker::dp::DataParallel;
using worker::dp::DataParallelOptions;

const worker::InputSpec kInput{1, 8, 8, 5};

torch::nn::AnyModule freshModel(const std::string& name, uint64_t seed) {
  worker::ModelConfig config;
  config.name = name;
  config.hidden = {16, 12};
  torch::manual_seed(seed);
  return worker::makeModel(config, kInput);
}

DataParallelOptions cpuReplicas(int n) {
  DataParallelOptions o;
  o.devices.assign(static_cast<std::size_t>(n), c10::Device(c10::kCPU));
  return o;
}

torch::optim::SGDOptions sgdOptions(double momentum) {
  return torch::optim::SGDOptions(0.1).momentum(momentum).weight_decay(momentum > 0 ? 1e-3 : 0.0);
}

double maxDiff(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto sa = ddp::stateDict(a);
  const auto sb = ddp::stateDict(b);
  EXPECT_EQ(sa.size(), sb.size());
  double diff = 0;
  for (const auto& [key, value] : sa) diff = std::max(diff, (value - sb.at(key)).abs().max().item<double>());
  return diff;
}

struct StepCase {
  std::string model;
  int replicas;
  std::vector<int64_t> batches;  // rows of each step's batch
  double momentum;
};

std::ostream& operator<<(std::ostream& out, const StepCase& c) {
  out << c.model << "_r" << c.replicas << "_b";
  for (auto b : c.batches) out << b << "_";
  return out << (c.momentum > 0 ? "momentum" : "plain");
}

class DataParallelStep : public ::testing::TestWithParam<StepCase> {};

// K steps of DataParallel (N replicas) equal K plain steps on the same full
// batches: same loss each step, same gradients, same parameters (1e-5).
TEST_P(DataParallelStep, EqualsSingleProcessStepOnTheFullBatch) {
  const StepCase c = GetParam();
  auto reference = freshModel(c.model, 7);
  auto master = freshModel(c.model, 7);
  ASSERT_EQ(maxDiff(*reference.ptr(), *master.ptr()), 0.0);
  torch::optim::SGD refSgd(reference.ptr()->parameters(), sgdOptions(c.momentum));
  torch::optim::SGD dpSgd(master.ptr()->parameters(), sgdOptions(c.momentum));
  DataParallel dp(master, cpuReplicas(c.replicas));

  torch::manual_seed(11);
  for (std::size_t step = 0; step < c.batches.size(); ++step) {
    const int64_t rows = c.batches[step];
    const at::Tensor x = at::randn({rows, kInput.channels, kInput.height, kInput.width});
    const at::Tensor y = at::randint(kInput.classes, {rows}, at::kLong);

    refSgd.zero_grad();
    const at::Tensor refLoss = torch::nn::functional::cross_entropy(reference.forward(x), y);
    refLoss.backward();

    dpSgd.zero_grad();
    const at::Tensor dpLoss = torch::nn::functional::cross_entropy(dp.forward(x), y);
    dpLoss.backward();
    // torch.chunk's parts: ceil(rows / replicas) each, so as many replicas as that fills (9 over 4: 3).
    const int64_t part = (rows + c.replicas - 1) / c.replicas;
    EXPECT_EQ(dp.lastReplicasUsed(), (rows + part - 1) / part) << "step " << step;
    EXPECT_NEAR(dpLoss.item<double>(), refLoss.item<double>(), 1e-6) << "step " << step;

    const auto refParams = reference.ptr()->named_parameters();
    const auto dpParams = master.ptr()->named_parameters();
    for (const auto& item : refParams) {
      const at::Tensor& g = dpParams[item.key()].grad();
      ASSERT_TRUE(g.defined()) << item.key() << " got no gradient from DataParallel";
      EXPECT_LT((g - item.value().grad()).abs().max().item<double>(), 1e-5) << item.key() << " step " << step;
    }
    refSgd.step();
    dpSgd.step();
    EXPECT_LT(maxDiff(*reference.ptr(), *master.ptr()), 1e-5) << "after step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(
    CpuReplicas, DataParallelStep,
    ::testing::Values(
        // one step: even split, uneven split, a batch smaller than the replica count
        StepCase{"mlp", 1, {8}, 0.0}, StepCase{"mlp", 2, {8}, 0.0}, StepCase{"mlp", 2, {9}, 0.0},
        StepCase{"mlp", 3, {8}, 0.0}, StepCase{"mlp", 3, {2}, 0.0}, StepCase{"mlp", 4, {8}, 0.0},
        StepCase{"mlp", 4, {10}, 0.0}, StepCase{"mlp", 4, {3}, 0.0}, StepCase{"mlp", 4, {1}, 0.0},
        StepCase{"cnn", 1, {6}, 0.0}, StepCase{"cnn", 2, {7}, 0.0}, StepCase{"cnn", 3, {10}, 0.0},
        StepCase{"cnn", 4, {2}, 0.0},
        // several steps with momentum and weight decay, ending with a short batch
        StepCase{"mlp", 3, {12, 12, 12, 5}, 0.9}, StepCase{"mlp", 4, {16, 16, 16, 3}, 0.9},
        StepCase{"cnn", 2, {8, 8, 8, 1}, 0.9}, StepCase{"cnn", 4, {9, 9, 2}, 0.9}),
    [](const ::testing::TestParamInfo<StepCase>& info) {
      std::ostringstream name;
      name << info.param;
      return name.str();
    });

// nn.DataParallel's scatter is torch.chunk (torch/csrc/cuda/comm.cpp scatter: tensor.chunk(devices)):
// with BatchNorm the parts' sizes shape the result, so they must be PyTorch's. Python's
// [c.shape[0] for c in torch.arange(b).chunk(n)] gives the literals; LibTorch's chunk the rest.
TEST(ScatterSizes, AreTorchChunksAsNnDataParallelScatters) {
  using worker::dp::scatterSizes;
  EXPECT_EQ(scatterSizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(scatterSizes(9, 4), (std::vector<int64_t>{3, 3, 3}));  // three replicas of four
  EXPECT_EQ(scatterSizes(5, 4), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(scatterSizes(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(scatterSizes(2, 4), (std::vector<int64_t>{1, 1}));
  for (int64_t n = 1; n <= 5; ++n) {
    for (int64_t b = 1; b <= 23; ++b) {
      std::vector<int64_t> chunks;
      for (const auto& c : torch::arange(b).chunk(n)) chunks.push_back(c.size(0));
      EXPECT_EQ(scatterSizes(b, n), chunks) << b << " rows over " << n;
    }
  }
}

// Records which thread runs each replica and its intra-op thread count.
struct ProbeLog {
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::vector<int> intraOp;
  std::condition_variable arrivedChanged;
  int arrived = 0;
  int expected = 0;     // replicas that must meet in forward
  bool allMet = true;   // every replica saw all the others arrive
};
ProbeLog gProbe;

class ProbeImpl : public torch::nn::Cloneable<ProbeImpl> {
 public:
  ProbeImpl() { reset(); }
  void reset() override { lin_ = register_module("lin", torch::nn::Linear(4, 2)); }
  at::Tensor forward(at::Tensor x) {
    {
      std::lock_guard<std::mutex> lock(gProbe.mutex);
      gProbe.threads.insert(std::this_thread::get_id());
      gProbe.intraOp.push_back(at::get_num_threads());
    }
    // A rendezvous of the replicas: each waits here until all of them have arrived, which
    // happens only if they run at the same time (a generous bound turns a serial run into a
    // recorded failure instead of a hang).
    {
      std::unique_lock<std::mutex> lock(gProbe.mutex);
      ++gProbe.arrived;
      gProbe.arrivedChanged.notify_all();
      const bool together = gProbe.arrivedChanged.wait_for(lock, std::chrono::seconds(20),
                                                           [] { return gProbe.arrived >= gProbe.expected; });
      gProbe.allMet = gProbe.allMet && together;
    }
    return lin_->forward(x);
  }

 private:
  torch::nn::Linear lin_{nullptr};
};
TORCH_MODULE(Probe);

TEST(ReplicaThreads, OneThreadPerReplicaWithOneIntraOpThreadEachAndCallerUnchanged) {
  at::set_num_threads(2);
  DataParallel dp(torch::nn::AnyModule(Probe()), cpuReplicas(4));
  gProbe.expected = 4;
  dp.forward(at::randn({8, 4})).sum().backward();
  EXPECT_EQ(gProbe.threads.size(), 4u);
  EXPECT_EQ(gProbe.threads.count(std::this_thread::get_id()), 0u);
  for (int n : gProbe.intraOp) EXPECT_EQ(n, 1);
  EXPECT_EQ(gProbe.arrived, 4);
  EXPECT_TRUE(gProbe.allMet) << "the 4 replicas' forwards did not run at the same time";
  EXPECT_EQ(at::get_num_threads(), 2) << "the caller's intra-op setting changed";
}

// The threads of this process now (/proc/self/task).
std::ptrdiff_t processThreads() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator());
}

// nn.DataParallel with one device calls its module: the output is the master's own (its graph ends
// in the model's last op, not in DataParallelBackward), so one replica costs what the model costs
// (it ran at 0.76x single in bench/dp through a replica, a gather and a second backward), and no
// replica thread is started for it.
TEST(DataParallel, OneReplicaOnTheMastersDeviceIsTheMasterItself) {
  auto master = freshModel("cnn", 3);
  {
    const std::ptrdiff_t before = processThreads();
    DataParallel two(master, cpuReplicas(2));  // replicas run on threads of their own
    EXPECT_GE(processThreads(), before + 2);
  }
  const std::ptrdiff_t before = processThreads();
  DataParallel dp(master, cpuReplicas(1));
  EXPECT_EQ(processThreads(), before);  // no replica thread: the master runs on the caller's
  const at::Tensor x = at::randn({5, 1, 8, 8});
  const at::Tensor out = dp.forward(x);
  ASSERT_TRUE(out.requires_grad());
  EXPECT_NE(out.grad_fn()->name(), "DataParallelBackward");
  EXPECT_TRUE(out.equal(master.forward(x)));
  EXPECT_EQ(dp.lastReplicasUsed(), 1);
  out.sum().backward();
  for (const auto& p : master.ptr()->parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST(DataParallel, NoGradForwardEqualsTheMasterAndLeavesNoGraph) {
  auto master = freshModel("cnn", 3);
  DataParallel dp(master, cpuReplicas(3));
  master.ptr()->eval();
  const at::Tensor x = at::randn({7, 1, 8, 8});
  c10::NoGradGuard noGrad;
  const at::Tensor out = dp.forward(x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_LT((out - master.forward(x)).abs().max().item<double>(), 1e-6);
}

}  // namespace
}  // namespace ddp
