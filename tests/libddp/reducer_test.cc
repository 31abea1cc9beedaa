// Tier 1 and 2: the Reducer (libddp/engine/) against plain autograd, on the public ProcessGroup over
// ranks as threads. Expected gradients are the mean over ranks of each rank's gradient, computed here
// without any reducer.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <thread>

#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "common/error.h"
#include "libddp/torch_compat.h"
#include "libddp/engine/reducer.h"
#include "libddp/internal.h"
#include "tests/comm/thread_ranks.h"

namespace ddp::engine {
namespace {

using comm::CompletedWork;
using comm::Communicator;
using comm::PendingWork;
using comm::test::runRanks;

/// The rank's thread's communicator as the public group the Reducer takes.
ProcessGroup groupOf(Communicator& comm) { return internal::wrapCommunicator(comm, c10::Device(c10::kCPU)); }

/// A two-layer net as plain leaf tensors; every rank builds the same values.
struct Net {
  std::vector<at::Tensor> params;  // w1 [8,5], b1 [8], w2 [3,8], b2 [3], extra [2] (maybe unused)
  std::vector<std::string> names = {"w1", "b1", "w2", "b2", "extra"};

  // Private generators: ranks are threads, the global one would race.
  Net() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    for (auto shape : std::vector<std::vector<int64_t>>{{8, 5}, {8}, {3, 8}, {3}, {2}}) {
      params.push_back(at::randn(shape, gen).requires_grad_(true));
    }
  }
  /// Loss on (rank, step)-specific input; `useExtra` false leaves params[4] out of the graph.
  at::Tensor loss(int rank, int step, bool useExtra = true) const {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + 10 * rank + step);
    const at::Tensor x = at::randn({4, 5}, gen);
    at::Tensor h = at::tanh(at::matmul(x, params[0].t()) + params[1]);
    at::Tensor out = at::matmul(h, params[2].t()) + params[3];
    at::Tensor l = out.pow(2).mean();
    if (useExtra) l = l + (params[4] * params[4]).sum() * (rank + 1);
    return l;
  }
};

/// Mean over ranks of the plain-autograd gradients (sum over `steps` micro-batches).
std::vector<at::Tensor> expectedMean(int world, int step, int microBatches, bool useExtra = true) {
  std::vector<at::Tensor> sum;
  for (int r = 0; r < world; ++r) {
    Net net;
    for (int m = 0; m < microBatches; ++m) net.loss(r, step * 10 + m, useExtra).backward();
    for (size_t i = 0; i < net.params.size(); ++i) {
      at::Tensor g = net.params[i].grad().defined() ? net.params[i].grad()
                                                    : at::zeros_like(net.params[i]);
      if (sum.size() <= i) sum.push_back(g.clone()); else sum[i] += g;
    }
  }
  for (auto& g : sum) g /= world;
  return sum;
}

// The flat path and the multi-tensor broadcast, on both CPU backends.
class EngineWorld : public ::testing::TestWithParam<std::tuple<int, comm::Backend>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  comm::Backend backend() const { return std::get<1>(GetParam()); }
};

TEST_P(EngineWorld, BroadcastCopiesRootEverywhere) {
  const int world = this->world();
  runRanks(world, [world](Communicator& comm) {
    at::Tensor a = at::full({3, 5}, static_cast<float>(comm.rank()));
    at::Tensor b = at::full({7}, static_cast<float>(10 * comm.rank()));
    groupOf(comm).broadcast({a, b}, /*root=*/world - 1);  // one flat collective for both
    EXPECT_TRUE(a.eq(static_cast<float>(world - 1)).all().item<bool>());
    EXPECT_TRUE(b.eq(static_cast<float>(10 * (world - 1))).all().item<bool>());
  }, backend());
}

TEST_P(EngineWorld, GradientsAreAveragedAndMissingOnesCountAsZero) {
  const int world = this->world();
  runRanks(world, [world](Communicator& comm) {
    const int r = comm.rank();
    at::Tensor w = at::zeros({4, 3}).requires_grad_(true);
    at::Tensor bias = at::zeros({3}).requires_grad_(true);
    at::Tensor unused = at::zeros({2}).requires_grad_(true);
    w.mutable_grad() = at::full({4, 3}, static_cast<float>(r));
    bias.mutable_grad() = at::full({3}, static_cast<float>(2 * r + 1));
    at::Tensor loss = at::full({1}, static_cast<float>(r * r));
    ProcessGroup group = groupOf(comm);
    allReduceGradients(group, {w, bias, unused}, loss);
    const float meanR = (world - 1) / 2.0f;  // mean of 0..world-1
    EXPECT_NEAR(w.grad().max().item<float>(), meanR, 1e-6);
    EXPECT_NEAR(w.grad().min().item<float>(), meanR, 1e-6);
    EXPECT_NEAR(bias.grad()[0].item<float>(), 2 * meanR + 1, 1e-6);
    ASSERT_TRUE(unused.grad().defined());
    EXPECT_EQ(unused.grad().abs().sum().item<float>(), 0.0f);
    // mean of r^2 = (world-1)(2world-1)/6
    EXPECT_NEAR(loss.item<float>(), (world - 1) * (2 * world - 1) / 6.0f, 1e-5);
  }, backend());
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineWorld,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(comm::Backend::kGloo, comm::Backend::kShm)),
                         [](const auto& info) {
                           return std::string(backendName(std::get<1>(info.param))) +
                                  std::to_string(std::get<0>(info.param));
                         });

struct Variant {
  size_t firstCap;
  size_t cap;
  bool view;
  int microBatches;
};

class ReducerGloo : public ::testing::TestWithParam<std::tuple<int, Variant>> {};

TEST_P(ReducerGloo, GradientsAreTheMeanOverRanks) {
  const auto [world, v] = GetParam();
  runRanks(world, [world = world, v = v](Communicator& comm) {
    Net net;
    ReducerOptions opts;
    opts.firstBucketCapBytes = v.firstCap;
    opts.bucketCapBytes = v.cap;
    opts.gradientAsBucketView = v.view;
    Reducer reducer(groupOf(comm), net.params, net.names, opts);
    for (int step = 0; step < 3; ++step) {
      for (auto& p : net.params) {
        if (p.grad().defined()) p.grad().zero_();
      }
      for (int m = 0; m < v.microBatches; ++m) {
        at::Tensor loss = net.loss(comm.rank(), step * 10 + m);
        if (m + 1 == v.microBatches) reducer.prepareForBackward({loss});  // else no_sync
        loss.backward();
      }
      const auto expected = expectedMean(world, step, v.microBatches);
      for (size_t i = 0; i < net.params.size(); ++i) {
        const double diff = (net.params[i].grad() - expected[i]).abs().max().item<double>();
        EXPECT_LT(diff, 1e-6) << net.names[i] << " step " << step << " rank " << comm.rank()
                              << " got " << net.params[i].grad().flatten().slice(0, 0, 3)
                              << " want " << expected[i].flatten().slice(0, 0, 3);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ReducerGloo,
    ::testing::Combine(::testing::Values(2, 3),
                       ::testing::Values(Variant{1u << 20, 25u << 20, false, 1},  // one bucket
                                         Variant{1, 1, false, 1},     // a bucket per parameter
                                         Variant{100, 64, true, 1},   // bucket view, mixed sizes
                                         Variant{1, 1, true, 3},      // accumulation, view
                                         Variant{1u << 20, 25u << 20, false, 2})));

// One synchronising step of `net` on this rank through a reducer with `opts`.
void reducedStep(Communicator& comm, Net& net, const ReducerOptions& opts) {
  Reducer reducer(groupOf(comm), net.params, net.names, opts);
  at::Tensor loss = net.loss(comm.rank(), 0);
  reducer.prepareForBackward({loss});
  loss.backward();
}

// What two ranks' compressed all-reduce gives, by formula: each rank sends wire(g_r) / 2 (cast,
// then divide: the compress hooks' arithmetic) and the sum is rounded to the wire dtype.
std::vector<at::Tensor> wireSumOfTwoRanks(at::ScalarType wire) {
  std::vector<std::vector<at::Tensor>> perRank(2);
  for (int r = 0; r < 2; ++r) {
    Net plain;
    plain.loss(r, 0).backward();
    for (auto& p : plain.params) perRank[r].push_back((p.grad().to(wire) / 2).to(at::kFloat));
  }
  std::vector<at::Tensor> sum;
  for (size_t i = 0; i < perRank[0].size(); ++i) sum.push_back((perRank[0][i] + perRank[1][i]).to(wire).to(at::kFloat));
  return sum;
}

TEST(ReducerCompression, Fp16WireMatchesRoundedSumAtWorldTwo) {
  runRanks(2, [](Communicator& comm) {
    Net net;
    ReducerOptions opts;
    opts.compression = WireDtype::kFp16;
    reducedStep(comm, net, opts);
    // Gloo adds two halves and rounds to half.
    const std::vector<at::Tensor> sums = wireSumOfTwoRanks(at::kHalf);
    for (size_t i = 0; i < net.params.size(); ++i) {
      const at::Tensor& expected = sums[i];
      const at::Tensor got = net.params[i].grad();
      EXPECT_TRUE(at::equal(got, got.to(at::kHalf).to(at::kFloat))) << "not fp16 on the wire";
      EXPECT_LT((got - expected).abs().max().item<double>(), 1e-3 * expected.abs().max().item<double>() + 1e-7)
          << net.names[i];
    }
  });
}

TEST(ReducerCompression, Bf16WireRoundsToBf16OnGlooThatSumsItAndIsRefusedOtherwise) {
  runRanks(2, [](Communicator& comm) {
    Net net;
    ReducerOptions opts;
    opts.compression = WireDtype::kBf16;
    if (!compat::kGlooSumsBFloat16) {
      // Gloo in LibTorch 1.13 has no bfloat16 sum: refused up front, on every rank.
      try {
        Reducer refused(groupOf(comm), net.params, net.names, opts);
        ADD_FAILURE() << "bf16 on a Gloo without bfloat16 sums was accepted";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("use fp16"), std::string::npos) << e.what();
      }
      return;
    }
    // LibTorch 2.x's Gloo sums bfloat16 (Python 2.15's gloo all_reduce of two bf16 tensors equals
    // bf16(float(a) + float(b)) exactly): this branch must run there, and match that formula bit for bit.
    reducedStep(comm, net, opts);
    // Gloo adds the two in float and rounds the sum to bf16.
    const std::vector<at::Tensor> sums = wireSumOfTwoRanks(at::kBFloat16);
    for (size_t i = 0; i < net.params.size(); ++i) {
      const at::Tensor& expected = sums[i];
      const at::Tensor got = net.params[i].grad();
      EXPECT_TRUE(at::equal(got, expected)) << net.names[i] << " max diff "
                                            << (got - expected).abs().max().item<double>();
    }
  });
}

TEST(ReducerUnused, WithoutFindUnusedBackwardFailsNamingTheParameter) {
  runRanks(2, [](Communicator& comm) {
    Net net;
    Reducer reducer(groupOf(comm), net.params, net.names, ReducerOptions{});
    at::Tensor loss = net.loss(comm.rank(), 0, /*useExtra=*/false);
    reducer.prepareForBackward({loss});
    try {
      loss.backward();
      ADD_FAILURE() << "backward should fail: 'extra' got no gradient";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("extra"), std::string::npos) << what;
      // The library's own option (the worker names its YAML key instead: e2e ddp_equivalence).
      EXPECT_NE(what.find("ddp::DdpOptions::findUnusedParameters = true"), std::string::npos) << what;
    }
  });
}

TEST(ReducerUnused, WithFindUnusedTrainingProceedsAndUnusedGradStaysUndefined) {
  runRanks(2, [](Communicator& comm) {
    Net net;
    ReducerOptions opts;
    opts.findUnusedParameters = true;
    opts.firstBucketCapBytes = opts.bucketCapBytes = 1;  // 'extra' alone in bucket 0
    Reducer reducer(groupOf(comm), net.params, net.names, opts);
    for (int step = 0; step < 2; ++step) {
      for (auto& p : net.params) {
        if (p.grad().defined()) p.grad().zero_();
      }
      at::Tensor loss = net.loss(comm.rank(), step * 10, /*useExtra=*/false);
      reducer.prepareForBackward({loss});
      loss.backward();
      const auto expected = expectedMean(2, step, 1, /*useExtra=*/false);
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_LT((net.params[i].grad() - expected[i]).abs().max().item<double>(), 1e-6);
      }
      EXPECT_FALSE(net.params[4].grad().defined()) << "unused on every rank: left untouched";
    }
  });
}

/// Fake world of `n` identical ranks: SUM multiplies by n. Records launches.
class RecordingCommunicator final : public Communicator {
 public:
  explicit RecordingCommunicator(int n, const std::atomic<int>* hooks) : n_(n), hooks_(hooks) {}
  int rank() const override { return 0; }
  int size() const override { return n_; }
  std::string backendName() const override { return "recording"; }
  std::unique_ptr<PendingWork> allReduce(at::Tensor& t, const AllReduceOptions& options) override {
    EXPECT_EQ(options.op, ReduceOp::kSum);
    launches.push_back(t.numel());
    hooksAtLaunch.push_back(hooks_->load());
    t.mul_(n_);
    return std::make_unique<CompletedWork>();
  }
  std::unique_ptr<PendingWork> broadcast(at::Tensor&, const BroadcastOptions&) override {
    return std::make_unique<CompletedWork>();
  }
  std::unique_ptr<PendingWork> barrier(const CollectiveOptions&) override { return std::make_unique<CompletedWork>(); }
  std::vector<int64_t> launches;
  std::vector<int> hooksAtLaunch;

 private:
  int n_;
  const std::atomic<int>* hooks_;
};

TEST(ReducerOrder, BucketsLaunchInOrderDuringBackwardAndNotUnderNoSync) {
  std::atomic<int> hooks{0};
  RecordingCommunicator comm(4, &hooks);
  Net net;
  for (auto& p : net.params) p.register_hook([&hooks](const at::Tensor&) { ++hooks; });
  ReducerOptions opts;
  opts.firstBucketCapBytes = opts.bucketCapBytes = 1;
  Reducer reducer(groupOf(comm), net.params, net.names, opts);
  ASSERT_EQ(reducer.bucketIndices().size(), 5u);

  net.loss(0, 0).backward();  // not prepared: no_sync, local accumulation only
  EXPECT_TRUE(comm.launches.empty());

  at::Tensor loss = net.loss(0, 1);
  reducer.prepareForBackward({loss});
  loss.backward();
  std::vector<int64_t> expected;
  for (const auto& bucket : reducer.bucketIndices()) expected.push_back(net.params[bucket[0]].numel());
  EXPECT_EQ(comm.launches, expected);
  // Overlap: the first bucket went out before backward reached every parameter.
  ASSERT_FALSE(comm.hooksAtLaunch.empty());
  EXPECT_LT(comm.hooksAtLaunch.front() - 5, 5) << "first launch waited for the whole backward";
}

}  // namespace
}  // namespace ddp::engine
