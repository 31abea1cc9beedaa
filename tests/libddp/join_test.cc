// ddp::Join (<ddp/join.h>) against PyTorch's Join around DDP (tests/python/join_reference.py, 3
// processes over Gloo): 3 ranks under ddp-launch (DDP_TEST_BACKEND shm or gloo) with 7, 10 and 13
// batches finish together with the parameters and buffers PyTorch's ranks end with; the early
// termination option stops every rank with one line; a Join around a group of one does nothing.
// backwardWithoutBatch(), Join's static twin, against the same reference and the averaging formula.
#include <ATen/CPUGeneratorImpl.h>
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <optional>
#include <string>

#include "tests/support/run_command.h"

namespace {

std::optional<ddp::ProcessGroup> theGroup;
ddp::ProcessGroup& group() { return *theGroup; }

const int kBatches[] = {7, 10, 13};

// Rank 0 runs PyTorch's reference and hands the JSON to the others.
const nlohmann::json& reference() {
  static const nlohmann::json ref = [] {
    std::string text;
    if (group().rank() == 0) {
      const auto run = ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/join_reference.py"},
                                             ddp::test::stdoutOnly());
      if (run.exitCode == 0) text = run.output;
    }
    at::Tensor size = torch::tensor({static_cast<int64_t>(text.size())});
    group().broadcast(size, 0);
    at::Tensor bytes = torch::zeros({size.item<int64_t>()}, torch::kUInt8);
    if (group().rank() == 0) std::memcpy(bytes.data_ptr(), text.data(), text.size());
    group().broadcast(bytes, 0);
    if (bytes.numel() == 0) throw std::runtime_error("the Python reference (join_reference.py) failed");
    return nlohmann::json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
  }();
  return ref;
}

// The reference's model and initial values (see join_reference.py).
torch::nn::Sequential makeModel() {
  torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::BatchNorm1d(8), torch::nn::Linear(8, 3));
  torch::NoGradGuard noGrad;
  int k = 0;
  auto init = [&k](const std::string& name, torch::Tensor t) {
    if (!t.is_floating_point()) return;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(k++));
    torch::Tensor values = 0.3 * at::randn(t.sizes(), gen);
    t.copy_(name.size() >= 11 && name.substr(name.size() - 11) == "running_var" ? 1 + values * values : values);
  };
  for (const auto& p : model->named_parameters()) init(p.key(), p.value());
  for (const auto& b : model->named_buffers()) init(b.key(), b.value());
  return model;
}

struct Trained {
  torch::nn::Sequential model;
  int steps = 0;
};

// With `zero`, the optimizer is a ddp::ZeroRedundancyOptimizer given to the Join too (each rank
// steps and broadcasts its shard, the joined ones included).
Trained train(ddp::DdpOptions options, ddp::JoinOptions join, int batches, bool zero = false) {
  Trained run{makeModel(), 0};
  ddp::DistributedDataParallel<torch::nn::Sequential> ddpModel(run.model, group(), options);
  const auto sgd = torch::optim::SGDOptions(0.1).momentum(0.9);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (zero) {
    opt = std::make_unique<ddp::ZeroRedundancyOptimizer>(run.model->parameters(), group(), sgd);
  } else {
    opt = std::make_unique<torch::optim::SGD>(run.model->parameters(), sgd);
  }
  auto steps = [&] {
    for (int b = 0; b < batches; ++b) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(100 * group().rank() + b));
      const torch::Tensor x = at::randn({5, 6}, gen);
      opt->zero_grad();
      ddpModel(x).pow(2).mean().backward();
      opt->step();
      ++run.steps;
    }
  };
  if (zero) {  // (a Join's destructor may throw: a scope, not an optional)
    ddp::Join scope(ddpModel, static_cast<ddp::ZeroRedundancyOptimizer&>(*opt), join);
    steps();
  } else {
    ddp::Join scope(ddpModel, join);
    steps();
  }
  return run;
}

// The reference runs on PyTorch 2.x. LibTorch 1.13's CPU BatchNorm kernels round differently, and
// over 13 steps with momentum the layers before the BatchNorm drift by up to ~5e-4 from it; a Join
// that mishandled the divisor, the buffers' source or a shadowed step is off by 1e-2 and more.
#if TORCH_VERSION_MAJOR >= 2
constexpr double kTolerance = 1e-5;
#else
constexpr double kTolerance = 2e-3;
#endif

class JoinAgainstPyTorch : public ::testing::TestWithParam<std::string> {};

TEST_P(JoinAgainstPyTorch, UnevenRanksFinishTogetherWithPyTorchsModel) {
  const std::string name = GetParam();
  ddp::DdpOptions options;
  options.broadcastBuffers = name.find("buffers1") != std::string::npos;
  ddp::JoinOptions join;
  join.divideByInitialWorldSize = name.find("divide1") != std::string::npos;
  const bool zero = name.find("_zero") != std::string::npos;
  const nlohmann::json& ref = reference().at(zero ? name.substr(0, name.find("_zero")) : name);
  const int rank = group().rank();
  const Trained run = train(options, join, kBatches[rank], zero);
  EXPECT_EQ(run.steps, ref.at("steps").at(rank).get<int>());
  const nlohmann::json& expected = ref.at("ranks").at(rank);
  int compared = 0;
  auto check = [&](const std::string& key, const torch::Tensor& t) {
    if (!t.is_floating_point()) return;
    ASSERT_TRUE(expected.contains(key)) << key;
    const torch::Tensor want = torch::tensor(expected.at(key).get<std::vector<double>>(), torch::kDouble);
    const double err = (t.detach().flatten().to(torch::kDouble) - want).abs().max().item<double>();
    EXPECT_LE(err, kTolerance) << name << ": " << key << " differs from PyTorch's rank " << rank;
    ++compared;
  };
  for (const auto& p : run.model->named_parameters()) check(p.key(), p.value());
  for (const auto& b : run.model->named_buffers()) check(b.key(), b.value());
  EXPECT_EQ(compared, static_cast<int>(expected.size()));
}

INSTANTIATE_TEST_SUITE_P(Join, JoinAgainstPyTorch,
                         ::testing::Values("divide1_buffers1", "divide0_buffers1", "divide1_buffers0",
                                           // ZeRO in the Join: every shard follows the ranks still
                                           // training, so each rank ends with the last joiner's model
                                           "divide1_buffers1_zero", "divide0_buffers1_zero"));

TEST(Join, ThrowOnEarlyTerminationStopsEveryRankWithOneLine) {
  ddp::JoinOptions join;
  join.throwOnEarlyTermination = true;
  try {
    train({}, join, kBatches[group().rank()]);
    ADD_FAILURE() << "no rank noticed that rank 0 ran out";
  } catch (const ddp::Error& e) {
    const std::string what = e.what();
    if (group().rank() == 0) {
      EXPECT_NE(what.find("ddp::Join: rank 0 ran out of inputs first"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("ddp::Join: a rank ran out of inputs"), std::string::npos) << what;
    }
  }
  group().barrier();  // every rank left at the same collective: the group still pairs
}

TEST(Join, EvenInputsNeedNoShadowing) {
  // All ranks with the same count: every rank is a last joiner, the highest (rank 2) the source.
  const Trained run = train({}, {}, 4);
  for (const auto& p : run.model->parameters()) {
    torch::Tensor root = p.detach().clone();
    group().broadcast(root, 0);
    EXPECT_TRUE(torch::equal(root, p.detach()));
  }
}

// backwardWithoutBatch() (uneven shards every rank knows): each rank steps 13 times, its batches
// first, then steps without a batch. PyTorch's Join leaves a joined rank's optimizer behind and
// hands every rank the last joiner's parameters at the end; here every rank steps alike, so each
// ends with exactly those parameters (rank 2's, never joined) and its own running statistics (no
// buffer broadcast: with it, PyTorch's buffers come from the highest rank still training, ours
// from rank 0, which must hold a batch whenever another does).
TEST(BackwardWithoutBatch, UnevenShardsEndWithTheModelOfPyTorchsJoin) {
  const std::string name = "divide1_buffers0";
  const int rank = group().rank();
  Trained run{makeModel(), 0};
  ddp::DdpOptions options;
  options.broadcastBuffers = false;
  ddp::DistributedDataParallel<torch::nn::Sequential> ddpModel(run.model, group(), options);
  torch::optim::SGD opt(run.model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int b = 0; b < kBatches[2]; ++b) {
    opt.zero_grad();
    if (b < kBatches[rank]) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(100 * rank + b));
      ddpModel(at::randn({5, 6}, gen)).pow(2).mean().backward();
    } else {
      ddpModel.backwardWithoutBatch();
    }
    opt.step();
  }
  const nlohmann::json& expected = reference().at(name).at("ranks").at(rank);
  int compared = 0;
  auto check = [&](const std::string& key, const torch::Tensor& t) {
    if (!t.is_floating_point()) return;
    ASSERT_TRUE(expected.contains(key)) << key;
    const torch::Tensor want = torch::tensor(expected.at(key).get<std::vector<double>>(), torch::kDouble);
    const double err = (t.detach().flatten().to(torch::kDouble) - want).abs().max().item<double>();
    EXPECT_LE(err, kTolerance) << key << " differs from PyTorch's rank " << rank << " after Join";
    ++compared;
  };
  for (const auto& p : run.model->named_parameters()) check(p.key(), p.value());
  for (const auto& b : run.model->named_buffers()) check(b.key(), b.value());
  EXPECT_EQ(compared, static_cast<int>(expected.size()));
}

// One step of two micro-batch slots in which rank r holds {2, 1, 0}[r] micro-batches (the ones it
// lacks come last): after it every .grad is (1/3) * sum over ranks and held micro-batches of
// grad(loss / 2), computed here from the formula with a plain copy of the model and every rank's
// inputs; for the bucketed reducer (several buckets, also with find_unused_parameters and
// gradient_as_bucket_view) and the flat one.
class WithoutBatchAccumulated : public ::testing::TestWithParam<std::string> {};

// The gradient syncs these tests run through: the bucketed reducer (also with find_unused_parameters
// and gradient_as_bucket_view) in buckets of ~100 bytes (one per parameter or so), and the flat one.
ddp::DdpOptions reducerVariant(const std::string& variant) {
  ddp::DdpOptions options;
  options.bucketCapMb = 1e-4;
  options.firstBucketCapMb = 1e-4;
  options.reducer = variant == "flat" ? ddp::GradientReducer::kFlat : ddp::GradientReducer::kBucketed;
  options.findUnusedParameters = variant == "find_unused";
  options.gradientAsBucketView = variant == "bucket_view";
  return options;
}

TEST_P(WithoutBatchAccumulated, GradientsAreTheMeanOverTheMicroBatchesHeld) {
  const std::string variant = GetParam();
  const int held[] = {2, 1, 0};
  const int rank = group().rank();
  auto input = [](int r, int m) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(1000 + 10 * r + m));
    return at::randn({5, 6}, gen);
  };
  // The formula, on a plain copy.
  torch::nn::Sequential plain = makeModel();
  for (int r = 0; r < 3; ++r) {
    for (int m = 0; m < held[r]; ++m) (plain->forward(input(r, m)).pow(2).mean() / 2 / 3).backward();
  }
  torch::nn::Sequential model = makeModel();
  ddp::DistributedDataParallel<torch::nn::Sequential> ddpModel(model, group(), reducerVariant(variant));
  for (int step = 0; step < 2; ++step) {  // twice: the second starts from the first's state
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.grad().zero_();
    }
    for (int m = 0; m < 2; ++m) {
      if (m < held[rank]) {
        std::optional<ddp::DdpEngine::NoSync> noSync;
        if (m == 0) noSync.emplace(ddpModel.engine());
        (ddpModel(input(rank, m)).pow(2).mean() / 2).backward();
      } else if (m == 0) {
        auto noSync = ddpModel.noSync();
        ddpModel.backwardWithoutBatch();
      } else {
        ddpModel.backwardWithoutBatch();
      }
    }
    const auto mine = model->named_parameters();
    const auto want = plain->named_parameters();
    int compared = 0;
    for (const auto& p : mine) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      const double err = (p.value().grad() - want[p.key()].grad()).abs().max().item<double>();
      EXPECT_LE(err, 1e-6) << variant << " step " << step << ": " << p.key() << "'s gradient on rank " << rank;
      ++compared;
    }
    EXPECT_EQ(compared, 6);  // two Linear layers and the BatchNorm, weight and bias each
  }
}

INSTANTIATE_TEST_SUITE_P(BackwardWithoutBatch, WithoutBatchAccumulated,
                         ::testing::Values("bucketed", "flat", "find_unused", "bucket_view"));

// Rank 0 without a batch while the others train: the gradients are still the mean, but the buffers
// the others' forwards update are replaced by rank 0's at the next forward: rank 0 warns, once per
// model; not when buffers are not broadcast; the other ranks never.
TEST(BackwardWithoutBatch, OnRankZeroWithBroadcastBuffersWarnsOnce) {
  for (const bool broadcast : {true, false}) {
    torch::nn::Sequential model = makeModel();
    ddp::DdpOptions options;
    options.broadcastBuffers = broadcast;
    ddp::DistributedDataParallel<torch::nn::Sequential> ddpModel(model, group(), options);
    const auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
    spdlog::default_logger()->sinks().push_back(sink);
    for (int step = 0; step < 2; ++step) {
      if (group().rank() == 0) {
        ddpModel.backwardWithoutBatch();
      } else {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(7 + group().rank()));
        ddpModel(at::randn({5, 6}, gen)).pow(2).mean().backward();
      }
    }
    spdlog::default_logger()->sinks().pop_back();
    int warnings = 0;
    for (const std::string& line : sink->last_formatted()) {
      warnings += line.find("backwardWithoutBatch on rank 0: every forward takes the buffers") != std::string::npos;
    }
    EXPECT_EQ(warnings, broadcast && group().rank() == 0 ? 1 : 0) << "broadcastBuffers " << broadcast;
  }
}

// Two forwards through the wrapper, then one backward over both losses (two views of a batch, as
// contrastive learning does), with BatchNorm's buffers broadcast at each forward, as PyTorch's DDP
// runs it (checked: the pinned PyTorch's DDP runs this step): the second forward's broadcast must
// not bump the versions of the buffers the first one's graph saved, or the backward fails
// ("modified by an inplace operation", as ours did). Then a forward, an evaluation forward without
// grad, and the first one's backward. Every .grad is the formula's mean over ranks.
class TwoForwardsOneBackward : public ::testing::TestWithParam<std::string> {};

TEST_P(TwoForwardsOneBackward, GradientsAreTheMeanOfBothLossesOverRanks) {
  const std::string variant = GetParam();
  const int rank = group().rank();
  auto input = [](int r, int m) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(2000 + 10 * r + m));
    return at::randn({5, 6}, gen);
  };
  torch::nn::Sequential model = makeModel();
  ddp::DistributedDataParallel<torch::nn::Sequential> ddpModel(model, group(), reducerVariant(variant));
  for (const bool evaluateBetween : {false, true}) {
    torch::nn::Sequential plain = makeModel();  // the formula: every rank's losses on a plain copy
    for (int r = 0; r < 3; ++r) {
      for (int m = 0; m < (evaluateBetween ? 1 : 2); ++m) (plain->forward(input(r, m)).pow(2).mean() / 3).backward();
    }
    ddpModel.zeroGrad();
    at::Tensor loss = ddpModel(input(rank, 0)).pow(2).mean();
    if (evaluateBetween) {
      torch::NoGradGuard noGrad;
      ddpModel(input(rank, 1));
    } else {
      loss = loss + ddpModel(input(rank, 1)).pow(2).mean();
    }
    ASSERT_NO_THROW(loss.backward()) << variant;
    const auto want = plain->named_parameters();
    int compared = 0;
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      const double err = (p.value().grad() - want[p.key()].grad()).abs().max().item<double>();
      EXPECT_LE(err, 1e-6) << variant << (evaluateBetween ? ", evaluation between" : ", two forwards") << ": "
                           << p.key() << "'s gradient on rank " << rank;
      ++compared;
    }
    EXPECT_EQ(compared, 6);
  }
}

INSTANTIATE_TEST_SUITE_P(Reducers, TwoForwardsOneBackward,
                         ::testing::Values("bucketed", "flat", "find_unused", "bucket_view"));

TEST(BackwardWithoutBatch, InsideAJoinIsRefusedWithOneLine) {
  torch::nn::Sequential model = makeModel();
  ddp::DistributedDataParallel<torch::nn::Sequential> ddpModel(model, group());
  ddp::Join join(ddpModel);
  try {
    ddpModel.backwardWithoutBatch();
    ADD_FAILURE() << "backwardWithoutBatch ran inside a Join";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("inside a ddp::Join"), std::string::npos) << e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ddp::InitOptions options;
  if (const char* backend = std::getenv("DDP_TEST_BACKEND")) options.backend = ddp::parseBackend(backend).value();
  options.timeout = std::chrono::seconds(120);  // rank 0 runs PyTorch's reference meanwhile
  theGroup = ddp::initProcessGroup(options);
  if (theGroup->size() != 3) {
    std::fprintf(stderr, "join_test runs as 3 ranks: ddp-launch --nproc_per_node=3 %s\n", argv[0]);
    return 2;
  }
  torch::set_num_threads(1);
  const int rc = RUN_ALL_TESTS();
  theGroup->destroy();
  return rc;
}
