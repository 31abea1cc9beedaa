// The public library (libddp.so, <ddp/ddp.h>) as a user's program sees it: every rank runs these
// tests in the same order (their collectives meet), under `ddp-launch --nproc_per_node=2` and on
// its own (a group of one). Expected values come from formulas: DDP's averaged gradient is the
// gradient of the mean loss over the union of the shards, computed here on the whole batch.
#include <ddp/ddp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <type_traits>

#include "tests/support/run_command.h"

namespace {

// What InitOptions::beforeGroup saw, and the data it shared with ddp::loadOncePerHost.
struct BeforeGroup {
  int calls = 0;
  int rank = -1, size = -1, localRank = -1, localSize = -1;
  std::string device;
  int64_t timeoutMs = 0;
  int loads = 0;  // load() calls in this process
  ddp::HostCopy copy;
};
BeforeGroup& beforeGroup() {
  static BeforeGroup seen;
  return seen;
}

// The data a host's loading rank makes: known values, so every rank can check what it got.
torch::Tensor hostData() { return torch::arange(24, torch::kFloat).reshape({4, 6}) * 0.5; }

ddp::ProcessGroup& group() {
  static ddp::ProcessGroup g = [] {
    ddp::InitOptions options;
    options.timeout = std::chrono::seconds(60);  // a rank whose test failed early must not hang the other
    options.beforeGroup = [](const ddp::GroupStart& start) {
      BeforeGroup& seen = beforeGroup();
      ++seen.calls;
      seen.rank = start.rank();
      seen.size = start.size();
      seen.localRank = start.localRank();
      seen.localSize = start.localSize();
      seen.device = start.device().str();
      seen.timeoutMs = start.timeout().count();
      seen.copy = ddp::loadOncePerHost(start, [&seen] {
        ++seen.loads;
        return ddp::HostData{{hostData(), torch::tensor({3, 1, 4}, torch::kLong)}, "rows=4"};
      });
    };
    return ddp::initProcessGroup(options);
  }();
  return g;
}

// Equal on every rank: the sum over ranks is world × it.
bool equalOnAllRanks(const torch::Tensor& t) {
  auto local = t.detach().to(torch::kDouble).flatten().clone();
  auto sum = local.clone();
  group().allReduce(sum);
  return torch::allclose(sum, local * group().size(), 0, 1e-12);
}

torch::Tensor flatParams(const torch::nn::Module& m) {
  std::vector<torch::Tensor> ps;
  for (const auto& p : m.parameters()) ps.push_back(p.detach().flatten());
  return torch::cat(ps);
}

torch::Tensor flatGrads(const torch::nn::Module& m) {
  std::vector<torch::Tensor> gs;
  for (const auto& p : m.parameters()) gs.push_back(p.grad().defined() ? p.grad().flatten() : torch::zeros_like(p).flatten());
  return torch::cat(gs);
}

struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 7));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
};
TORCH_MODULE(Net);

// The same plain model, with `source`'s weights: the reference.
Net copyOf(const Net& source) {
  Net copy;
  torch::NoGradGuard noGrad;
  auto dst = copy->parameters();
  auto src = source->parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  return copy;
}

// The rows of `x` this rank's sampler gives it (no shuffle: rank r takes r, r+W, ...).
torch::Tensor shard(const torch::Tensor& x) {
  ddp::DistributedSampler sampler(x.size(0), group(), {/*shuffle=*/false});
  return x.index_select(0, torch::tensor(sampler.indices(), torch::kLong));
}

// First in this file, so before any test makes the group (gtest runs them in order).
TEST(ProcessGroup, RankBeforeInitProcessGroupIsAConfigError) {
  ASSERT_FALSE(ddp::isInitialized()) << "a test before this one made the group";
  try {
    (void)ddp::rank();
    ADD_FAILURE() << "ddp::rank() answered before initProcessGroup()";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("call initProcessGroup() first"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)ddp::worldSize(), ddp::ConfigError);
}

TEST(ProcessGroup, ReadsTheEnvContract) {
  const char* world = std::getenv("WORLD_SIZE");
  EXPECT_EQ(group().size(), world ? std::atoi(world) : 1);
  const char* rank = std::getenv("RANK");
  EXPECT_EQ(group().rank(), rank ? std::atoi(rank) : 0);
  EXPECT_EQ(group().device(), c10::Device(c10::kCPU));  // no GPU in this test
  auto t = torch::full({3}, static_cast<double>(group().rank() + 1));
  group().allReduce(t);
  const double w = group().size();
  EXPECT_TRUE(torch::equal(t, torch::full({3}, w * (w + 1) / 2)));  // 1 + 2 + ... + W
  auto b = torch::full({2}, static_cast<double>(group().rank()));
  group().broadcast(b, 0);
  EXPECT_TRUE(torch::equal(b, torch::zeros({2}, torch::kDouble)));
  EXPECT_THROW(ddp::initProcessGroup(), ddp::ConfigError);  // one group per process
}

TEST(ProcessGroup, BeforeGroupRunsOnceWithTheRanksPlace) {
  ddp::ProcessGroup& g = group();
  const BeforeGroup& seen = beforeGroup();
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.rank, g.rank());
  EXPECT_EQ(seen.size, g.size());
  EXPECT_EQ(seen.localRank, g.localRank());
  EXPECT_EQ(seen.localSize, g.localSize());
  EXPECT_EQ(seen.device, g.device().str());
  EXPECT_EQ(seen.timeoutMs, 60000);
}

TEST(LoadOncePerHost, OneRankOfTheHostLoadsTheOthersMapItsCopy) {
  ddp::ProcessGroup& g = group();
  const BeforeGroup& seen = beforeGroup();
  ASSERT_EQ(seen.copy.tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(seen.copy.tensors[0], hostData()));
  EXPECT_TRUE(torch::equal(seen.copy.tensors[1], torch::tensor({3, 1, 4}, torch::kLong)));
  EXPECT_EQ(seen.copy.meta, "rows=4");
  // Over the job (every rank of this test runs on one host): load() ran once, on the rank that
  // shared its copy; every other rank mapped that copy.
  auto counts = torch::tensor({static_cast<double>(seen.loads),
                               seen.copy.origin == ddp::HostCopyOrigin::kSharedByThisRank ? 1.0 : 0.0,
                               seen.copy.origin == ddp::HostCopyOrigin::kMappedFromHostCopy ? 1.0 : 0.0,
                               seen.copy.origin == ddp::HostCopyOrigin::kLoaded ? 1.0 : 0.0},
                              torch::kDouble);
  g.allReduce(counts);
  EXPECT_EQ(counts[0].item<double>(), 1.0);
  if (g.localSize() > 1) {
    EXPECT_EQ(g.localSize(), g.size());
    EXPECT_EQ(counts[1].item<double>(), 1.0);
    EXPECT_EQ(counts[2].item<double>(), g.size() - 1.0);
  } else {
    EXPECT_EQ(counts[3].item<double>(), g.size());  // alone: the data is simply loaded
  }
}

TEST(DistributedDataParallel, ReplicasStartFromRankZerosWeights) {
  torch::manual_seed(100 + group().rank());  // a different initialisation on every rank
  Net net;
  const bool differedBefore = !equalOnAllRanks(flatParams(*net));
  ddp::DistributedDataParallel<Net> model(net, group());
  EXPECT_TRUE(equalOnAllRanks(flatParams(*net)));
  EXPECT_EQ(differedBefore, group().size() > 1);
}

TEST(DistributedDataParallel, GradientIsTheGradientOfTheWholeBatch) {
  torch::manual_seed(1);
  const int64_t w = group().size();
  const auto x = torch::randn({8 * w, 5});
  const auto y = torch::randn({8 * w, 3});
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group(), {/*bucketCapMb=*/0.0001});  // several buckets
  Net reference = copyOf(net);
  torch::mse_loss(model(shard(x)), shard(y)).backward();
  torch::mse_loss(reference(x), y).backward();  // mean over all rows = mean of the shards' means
  EXPECT_TRUE(torch::allclose(flatGrads(*net), flatGrads(*reference), 1e-5, 1e-6));
}

// Issue 45 (7): rank 1 loads its data 80 ms late every step (a sleep, as a slow loader); every other
// rank then waits for it in the gradient all-reduce, and StragglerMonitor names it, by about that.
TEST(StragglerMonitor, NamesTheRankThatArrivesLastAndByHowMuch) {
  torch::manual_seed(2);
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  ddp::StragglerMonitor monitor(group());
  monitor.measure();  // from here on
  const auto x = torch::randn({8, 5});
  const auto y = torch::randn({8, 3});
  constexpr double kLateS = 0.08;
  for (int step = 0; step < 6; ++step) {
    if (group().rank() == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kLateS));
    torch::mse_loss(model(x), y).backward();
  }
  const ddp::StragglerReport report = monitor.measure();
  if (group().size() == 1) {
    EXPECT_EQ(report.straggler, -1);  // nobody to wait for
    return;
  }
  EXPECT_EQ(report.samples, 6);  // one wait per step
  EXPECT_EQ(report.straggler, 1);
  EXPECT_GT(report.skewS, 0.5 * kLateS) << "rank 0 waited " << report.medianWaitS[0] << " s, rank 1 " << report.medianWaitS[1];
  EXPECT_LT(report.skewS, 5 * kLateS);
  EXPECT_GE(report.p95WaitS[0], report.medianWaitS[0]);
  // The next look sees only what came after this one.
  EXPECT_EQ(monitor.measure().samples, 0);
}

// A model held the way plain LibTorch programs hold it: std::shared_ptr<YourModule>.
TEST(DistributedDataParallel, TakesAModelHeldInASharedPtr) {
  torch::manual_seed(3);
  const int64_t w = group().size();
  const auto x = torch::randn({4 * w, 5});
  const auto y = torch::randn({4 * w, 3});
  auto plain = std::make_shared<NetImpl>();
  Net reference = copyOf(Net(plain));  // a holder over the same module: copyOf reads its weights
  ddp::DistributedDataParallel model(plain, group());  // deduced: DistributedDataParallel<std::shared_ptr<NetImpl>>
  static_assert(std::is_same_v<decltype(model), ddp::DistributedDataParallel<std::shared_ptr<NetImpl>>>);
  EXPECT_EQ(model.module().get(), plain.get());
  torch::mse_loss(model(shard(x)), shard(y)).backward();
  torch::mse_loss(reference(x), y).backward();
  EXPECT_TRUE(torch::allclose(flatGrads(*plain), flatGrads(*reference), 1e-5, 1e-6));
}

// Code written for the single-process model, as in PyTorch's cpp/mnist: a function that took the
// model keeps its body and takes the wrapper (docs/library.md, "Porting a single-process program").
using DdpNet = ddp::DistributedDataParallel<std::shared_ptr<NetImpl>>;

double trainStep(DdpNet& model, torch::optim::Optimizer& optimizer, const torch::Tensor& x, const torch::Tensor& y) {
  model.train();
  optimizer.zero_grad();
  auto loss = torch::mse_loss(model.forward(x), y);
  loss.backward();
  optimizer.step();
  return loss.item<double>();
}

TEST(DistributedDataParallel, RunsCodeWrittenForTheModule) {
  torch::manual_seed(4);
  const int64_t w = group().size();
  const auto x = torch::randn({4 * w, 5});
  const auto y = torch::randn({4 * w, 3});
  auto net = std::make_shared<NetImpl>();
  DdpNet model(net, group());
  Net reference = copyOf(Net(net));
  // The module's calls reach the module.
  model.eval();
  EXPECT_FALSE(net->is_training());
  EXPECT_FALSE(model.is_training());
  model->train();
  EXPECT_TRUE(net->is_training());
  const auto mine = net->named_parameters();
  const auto seen = model.named_parameters();
  ASSERT_EQ(seen.size(), 4u);  // fc1.weight, fc1.bias, fc2.weight, fc2.bias
  ASSERT_EQ(model.parameters().size(), 4u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].key(), mine[i].key());
    EXPECT_TRUE(seen[i].value().is_same(mine[i].value()));
    EXPECT_TRUE(model.parameters()[i].is_same(mine[i].value()));
  }
  EXPECT_TRUE(model.buffers().empty());
  EXPECT_EQ(model.named_buffers().size(), 0u);
  // A step through the function: the gradient of the whole batch, the same parameters everywhere.
  torch::optim::SGD optimizer(model.parameters(), 0.1);
  trainStep(model, optimizer, shard(x), shard(y));
  torch::optim::SGD referenceOptimizer(reference->parameters(), 0.1);
  torch::mse_loss(reference(x), y).backward();
  referenceOptimizer.step();
  EXPECT_TRUE(torch::allclose(flatParams(*net), flatParams(*reference), 1e-5, 1e-6));
  EXPECT_TRUE(equalOnAllRanks(flatParams(*net)));
  model.zero_grad();  // set_to_none, as LibTorch 2.x's Module::zero_grad
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
  // Print guards without a group at hand.
  EXPECT_TRUE(ddp::isInitialized());
  EXPECT_EQ(ddp::rank(), group().rank());
  EXPECT_EQ(ddp::worldSize(), group().size());
}

TEST(DistributedDataParallel, AnEmptyModelIsAConfigErrorNotACrash) {
  std::shared_ptr<NetImpl> none;
  EXPECT_THROW(ddp::DistributedDataParallel<std::shared_ptr<NetImpl>>(none, group()), ddp::ConfigError);
  Net empty{nullptr};
  EXPECT_THROW(ddp::DistributedDataParallel<Net>(empty, group()), ddp::ConfigError);
}

TEST(DistributedDataParallel, FlatReducerGivesTheGradientOfTheWholeBatch) {
  torch::manual_seed(11);
  const int64_t w = group().size();
  const auto x1 = torch::randn({6 * w, 5}), y1 = torch::randn({6 * w, 3});
  const auto x2 = torch::randn({6 * w, 5}), y2 = torch::randn({6 * w, 3});
  Net net;
  ddp::DdpOptions options;
  options.reducer = ddp::GradientReducer::kFlat;
  ddp::DistributedDataParallel<Net> model(net, group(), options);
  Net reference = copyOf(net);
  torch::mse_loss(model(shard(x1)), shard(y1)).backward();
  torch::mse_loss(reference(x1), y1).backward();
  EXPECT_TRUE(torch::allclose(flatGrads(*net), flatGrads(*reference), 1e-5, 1e-6));
  {  // and with accumulation: the sum of both micro-batches' gradients, averaged once
    auto guard = model.noSync();
    torch::mse_loss(model(shard(x2)), shard(y2)).backward();
  }
  EXPECT_EQ(equalOnAllRanks(flatGrads(*net)), w == 1);
  torch::mse_loss(model(shard(x1)), shard(y1)).backward();
  torch::mse_loss(reference(x2), y2).backward();
  torch::mse_loss(reference(x1), y1).backward();
  EXPECT_TRUE(torch::allclose(flatGrads(*net), flatGrads(*reference), 1e-5, 1e-6));
}

// zeroGrad: every gradient zero in the tensors it had (bucket views stay views), with one aten::zero_
// for the whole bucket when the gradients are its views (the Net's 4 parameters fit DDP's 1 MB first
// bucket) and one per gradient otherwise; the next backward gives the whole batch's gradient again.
TEST(DistributedDataParallel, ZeroGradZeroesABucketOfViewsAtOnce) {
  for (const bool asView : {true, false}) {
    torch::manual_seed(12);
    const int64_t w = group().size();
    const auto x1 = torch::randn({6 * w, 5}), y1 = torch::randn({6 * w, 3});
    const auto x2 = torch::randn({6 * w, 5}), y2 = torch::randn({6 * w, 3});
    Net net;
    ddp::DdpOptions options;
    options.gradientAsBucketView = asView;
    options.syncOnOneRank = true;  // the reducer at world 1 too
    ddp::DistributedDataParallel<Net> model(net, group(), options);
    Net reference = copyOf(net);
    torch::mse_loss(model(shard(x1)), shard(y1)).backward();
    std::vector<const void*> where;
    for (const auto& p : net->parameters()) where.push_back(p.grad().data_ptr());
    static thread_local int zeroCalls = 0;
    zeroCalls = 0;
    const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(
        [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
          if (std::string(fn.name()) == "aten::zero_") ++zeroCalls;
          return nullptr;
        }));
    model.zeroGrad();
    at::removeCallback(handle);
    EXPECT_EQ(zeroCalls, asView ? 1 : 4) << "gradient as bucket view: " << asView;
    const auto params = net->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(params[i].grad().defined());
      EXPECT_EQ(params[i].grad().count_nonzero().item<int64_t>(), 0) << "parameter " << i;
      EXPECT_EQ(params[i].grad().data_ptr(), where[i]) << "parameter " << i;
    }
    torch::mse_loss(model(shard(x2)), shard(y2)).backward();
    torch::mse_loss(reference(x2), y2).backward();
    EXPECT_TRUE(torch::allclose(flatGrads(*net), flatGrads(*reference), 1e-5, 1e-6)) << "as view: " << asView;
  }
}

// PyTorch's rule (require_forward_param_sync): rank 0's buffers arrive before a forward that follows
// a synchronising one, so under noSync before the first micro-batch and not before the last.
TEST(DistributedDataParallel, BuffersArriveBeforeTheFirstMicroBatchOnly) {
  torch::nn::BatchNorm1d net(3);
  ddp::DistributedDataParallel<torch::nn::BatchNorm1d> model(net, group());  // running stats 0 / 1 everywhere
  torch::manual_seed(20 + group().rank());
  const auto x1 = torch::randn({6, 3}) + group().rank(), x2 = torch::randn({6, 3}) * 2 + group().rank();
  {
    auto guard = model.noSync();
    model(x1).sum().backward();  // broadcast (start state, equal anyway), then this rank's statistics
  }
  const auto afterFirst = net->running_mean.clone();
  EXPECT_EQ(equalOnAllRanks(afterFirst), group().size() == 1);
  model(x2).sum().backward();  // the last micro-batch: no broadcast, this rank's statistics go on
  // BatchNorm's update with momentum 0.1: mean ← 0.9 · mean + 0.1 · batch mean.
  const auto expected = afterFirst * 0.9 + x2.mean(0) * 0.1;
  EXPECT_TRUE(torch::allclose(net->running_mean, expected, 1e-5, 1e-6));
  model(x1).sum().backward();  // the next step's first forward: rank 0's buffers first
  // mean = 0.9 · rank 0's + 0.1 · this rank's batch mean: what it implies for rank 0's is rank 0's.
  const auto implied = ((net->running_mean - x1.mean(0) * 0.1) / 0.9).to(torch::kDouble);
  auto rankZeros = implied.clone();
  group().broadcast(rankZeros, 0);
  EXPECT_TRUE(torch::allclose(implied, rankZeros, 1e-5, 1e-6));
  if (group().rank() == 0) EXPECT_TRUE(torch::allclose(implied, expected.to(torch::kDouble), 1e-5, 1e-6));
}

TEST(DistributedDataParallel, NoSyncAccumulatesLocallyThenAveragesTheSum) {
  torch::manual_seed(2);
  const int64_t w = group().size();
  const auto x1 = torch::randn({4 * w, 5}), y1 = torch::randn({4 * w, 3});
  const auto x2 = torch::randn({4 * w, 5}), y2 = torch::randn({4 * w, 3});
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  Net reference = copyOf(net);
  {
    auto guard = model.noSync();
    torch::mse_loss(model(shard(x1)), shard(y1)).backward();
  }
  // Only this rank's micro-batch so far: the ranks' gradients differ.
  EXPECT_EQ(equalOnAllRanks(flatGrads(*net)), w == 1);
  torch::mse_loss(model(shard(x2)), shard(y2)).backward();
  torch::mse_loss(reference(x1), y1).backward();
  torch::mse_loss(reference(x2), y2).backward();
  EXPECT_TRUE(torch::allclose(flatGrads(*net), flatGrads(*reference), 1e-5, 1e-6));
}

struct BranchyImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  BranchyImpl() {
    a = register_module("a", torch::nn::Linear(4, 2));
    b = register_module("b", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(const torch::Tensor& x, bool useB) { return useB ? b(x) : a(x); }
};
TORCH_MODULE(Branchy);

TEST(DistributedDataParallel, FindUnusedParametersFinishesABackwardThatSkipsABranch) {
  torch::manual_seed(3);
  const int64_t w = group().size();
  const auto x = torch::randn({2 * w, 4});
  Branchy net;
  ddp::DdpOptions options;
  options.findUnusedParameters = true;
  ddp::DistributedDataParallel<Branchy> model(net, group(), options);
  Branchy reference;
  {
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < net->parameters().size(); ++i) reference->parameters()[i].copy_(net->parameters()[i]);
  }
  model(shard(x), false).pow(2).mean().backward();  // b takes no part: without the option, a hang
  reference->forward(x, false).pow(2).mean().backward();
  EXPECT_TRUE(torch::allclose(net->a->weight.grad(), reference->a->weight.grad(), 1e-5, 1e-6));
  const auto bGrad = net->b->weight.grad();
  EXPECT_TRUE(!bGrad.defined() || bGrad.abs().sum().item<double>() == 0.0);
}

// A frozen parameter (requires_grad false: fine-tuning some layers) gets rank 0's value as the
// others do and stays out of the gradient sync, as in PyTorch's DDP (it was refused with an
// internal check); the trainable ones get the whole batch's gradient.
TEST(DistributedDataParallel, FrozenParametersAreGivenRankZerosValueAndNotReduced) {
  torch::manual_seed(40 + group().rank());  // apart on every rank: the constructor makes them equal
  Net net;
  net->fc1->weight.set_requires_grad(false);
  ddp::DistributedDataParallel<Net> model(net, group());
  EXPECT_TRUE(equalOnAllRanks(net->fc1->weight));
  torch::manual_seed(2);
  const int64_t w = group().size();
  const auto x = torch::randn({4 * w, 5});
  const auto y = torch::randn({4 * w, 3});
  Net reference = copyOf(net);
  reference->fc1->weight.set_requires_grad(false);
  torch::mse_loss(model(shard(x)), shard(y)).backward();
  torch::mse_loss(reference(x), y).backward();
  EXPECT_FALSE(net->fc1->weight.grad().defined());
  for (const char* name : {"fc1.bias", "fc2.weight", "fc2.bias"}) {
    EXPECT_TRUE(torch::allclose(net->named_parameters()[name].grad(), reference->named_parameters()[name].grad(),
                                1e-5, 1e-6))
        << name;
  }
  Net frozen;
  for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  EXPECT_THROW(ddp::DistributedDataParallel<Net>(frozen, group()), ddp::ConfigError);
}

// A forward whose output is never backpropagated (a loss computed for a log line with grad mode on,
// a step given up), then the step's forward and backward: as in PyTorch's DDP the second forward
// takes the first's place (it was "the previous backward did not finish"), and the gradient is the
// whole batch's of the second.
TEST(DistributedDataParallel, AForwardWithoutBackwardIsTakenOverByTheNext) {
  torch::manual_seed(5);
  const int64_t w = group().size();
  const auto x = torch::randn({4 * w, 5});
  const auto y = torch::randn({4 * w, 3});
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  Net reference = copyOf(net);
  (void)model(shard(x * 3));  // never backpropagated
  torch::mse_loss(model(shard(x)), shard(y)).backward();
  torch::mse_loss(reference(x), y).backward();
  EXPECT_TRUE(torch::allclose(flatGrads(*net), flatGrads(*reference), 1e-5, 1e-6));
}

TEST(DistributedDataParallel, BuffersFollowRankZeroBeforeEachForward) {
  torch::nn::BatchNorm1d net(3);
  ddp::DistributedDataParallel<torch::nn::BatchNorm1d> model(net, group());
  torch::manual_seed(10 + group().rank());
  {
    torch::NoGradGuard noGrad;
    net->forward(torch::randn({6, 3}) + group().rank());  // the plain module: this rank's statistics only
  }
  EXPECT_EQ(equalOnAllRanks(net->running_mean), group().size() == 1);
  net->eval();  // eval forwards leave the statistics alone, but DDP broadcasts them first
  torch::NoGradGuard noGrad;
  model(torch::randn({2, 3}));
  EXPECT_TRUE(equalOnAllRanks(net->running_mean));
  EXPECT_TRUE(equalOnAllRanks(net->running_var));
}

TEST(DistributedSampler, ShardsCoverTheDataSetEvenlyAndReshuffleEachEpoch) {
  const int64_t n = 10, w = group().size();
  ddp::DistributedSampler sampler(n, group(), {/*shuffle=*/true, /*seed=*/5});
  EXPECT_EQ(sampler.numSamples(), (n + w - 1) / w);  // ceil(N / W), padded
  auto counts = torch::zeros({n}, torch::kDouble);
  for (int64_t i : sampler.indices()) counts[i] += 1;
  group().allReduce(counts);
  EXPECT_GE(counts.min().item<double>(), 1.0);  // every sample once, the padding's head twice
  EXPECT_EQ(counts.sum().item<double>(), static_cast<double>(sampler.numSamples() * w));
  const auto epoch0 = sampler.indices();
  sampler.setEpoch(1);
  EXPECT_NE(sampler.indices(), epoch0);
  EXPECT_EQ(sampler.batches(3).size(), static_cast<size_t>((sampler.numSamples() + 2) / 3));
  EXPECT_THROW(sampler.batches(0), ddp::ConfigError);
}

// Issue 46 (13): after initProcessGroup a peer's death cannot kill this rank with SIGPIPE (the
// launcher starts workers with it at its default).
TEST(InitProcessGroup, SigpipeIsIgnoredAsInPython) {
  struct sigaction onPipe {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &onPipe), 0);
  EXPECT_EQ(onPipe.sa_handler, SIG_IGN);
}

// A loop stopped after its first batch resumes at world size 1 from positionAfter() with exactly
// the samples no rank took (unpadded: none twice, none skipped).
TEST(DistributedSampler, PositionAfterResumesAtAnotherWorldSize) {
  const int64_t n = 11, w = group().size(), batch = 2;
  const ddp::SamplerOptions options{/*shuffle=*/true, /*seed=*/3, /*dropLast=*/false, /*pad=*/false};
  ddp::DistributedSampler sampler(n, group(), options);
  sampler.setEpoch(2);
  auto counts = torch::zeros({n}, torch::kDouble);
  const auto batches = sampler.batches(batch);
  for (int64_t i : batches.front()) counts[i] += 1;
  group().allReduce(counts);
  EXPECT_EQ(sampler.samplesInBatches(0, 1, batch), static_cast<int64_t>(counts.sum().item<double>()));
  const int64_t start = sampler.positionAfter(1, batch);
  EXPECT_EQ(start, std::min<int64_t>(n, w * batch));
  ddp::DistributedSampler alone(n, 1, 0, options);
  alone.setEpoch(2, start);
  for (int64_t i : alone.indices()) counts[i] += 1;
  EXPECT_TRUE(counts.eq(1).all().item<bool>()) << counts;
  EXPECT_EQ(alone.batchesPerRank(batch), (n - start + batch - 1) / batch);
}

std::string scratchDir(const std::string& name) {
  // The same directory on every rank: rank 0 writes, every rank reads.
  const char* port = std::getenv("MASTER_PORT");
  auto dir = std::filesystem::temp_directory_path() / ("ddp_api_test_" + std::string(port ? port : "solo") + "_" + name);
  return dir.string();
}

// Three steps of `optimizer` on fixed data; a checkpoint after step 2, resumed into a fresh model and
// optimizer, must give the same step 3 to the bit (momentum / Adam moments restored).
template <typename MakeOptimizer>
void checkExactResume(const std::string& name, MakeOptimizer makeOptimizer) {
  const std::string dir = scratchDir(name);
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  group().barrier();
  torch::manual_seed(4);
  const auto x = torch::randn({6, 5}), y = torch::randn({6, 3});
  auto step = [&](ddp::DistributedDataParallel<Net>& model, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    torch::mse_loss(model(x), y).backward();
    opt.step();
  };
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  auto optimizer = makeOptimizer(*net);
  ddp::Checkpointer checkpointer(group(), {dir});
  step(model, *optimizer);
  step(model, *optimizer);
  const std::string path = checkpointer.save(*net, *optimizer, {0, 2, 2, 12});
  step(model, *optimizer);
  const auto expected = flatParams(*net);

  torch::manual_seed(99);
  Net fresh;
  ddp::DistributedDataParallel<Net> freshModel(fresh, group());
  auto freshOptimizer = makeOptimizer(*fresh);
  ddp::Checkpointer again(group(), {dir});
  const auto position = again.resume(*fresh, *freshOptimizer);
  ASSERT_TRUE(position.has_value());
  EXPECT_EQ(position->globalStep, 2);
  EXPECT_EQ(position->stepInEpoch, 2);
  EXPECT_EQ(position->samples, 12);
  step(freshModel, *freshOptimizer);
  EXPECT_TRUE(torch::equal(flatParams(*fresh), expected));
  EXPECT_TRUE(std::filesystem::exists(path));
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Checkpointer, SgdWithMomentumResumesExactly) {
  checkExactResume("sgd", [](NetImpl& net) {
    return std::make_unique<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  });
}

TEST(Checkpointer, AdamResumesExactly) {
  checkExactResume("adam", [](NetImpl& net) {
    return std::make_unique<torch::optim::Adam>(net.parameters(), torch::optim::AdamOptions(0.01));
  });
}

// FusedAdamW's state (float step tensors, moments) travels under Adam's names too.
TEST(Checkpointer, FusedAdamWResumesExactly) {
  if (!ddp::FusedAdamW::available(torch::kCPU)) {
    Net net;
    EXPECT_THROW(ddp::FusedAdamW(net->parameters()), ddp::ConfigError);  // LibTorch 1.13: no fused kernel
    return;
  }
  checkExactResume("fused_adamw", [](NetImpl& net) {
    ddp::FusedAdamWOptions o;
    o.lr = 0.01;
    o.weightDecay = 0.1;
    return std::make_unique<ddp::FusedAdamW>(net.parameters(), o);
  });
}

// FusedSGD is a LibTorch SGD to checkpoints: its momentum buffers come back, step 3 is the same.
TEST(Checkpointer, FusedSgdResumesExactly) {
  if (!ddp::FusedSGD::available(torch::kCPU)) {
    Net net;
    EXPECT_THROW(ddp::FusedSGD(net->parameters(), torch::optim::SGDOptions(0.1)), ddp::ConfigError);
    return;
  }
  checkExactResume("fused_sgd", [](NetImpl& net) {
    return std::make_unique<ddp::FusedSGD>(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  });
}

// AdamW under an fp16 GradScaler: the moments (by parameter name) and the scaler's scale and growth
// tracker come back from the checkpoint, so step 3 is the same to the bit.
TEST(Checkpointer, AdamWWithGradScalerResumesExactly) {
  const std::string dir = scratchDir("adamw_scaler");
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  group().barrier();
  torch::manual_seed(6);
  const auto x = torch::randn({6, 5}), y = torch::randn({6, 3});
  const ddp::GradScalerOptions options{1024.0, 2.0, 0.5, /*growthInterval=*/2};
  auto step = [&](ddp::DistributedDataParallel<Net>& model, torch::optim::Optimizer& opt, ddp::GradScaler& scaler) {
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model(x), y)).backward();
    scaler.step(opt);
    scaler.update();
  };
  auto makeAdamW = [](NetImpl& net) {
    return std::make_unique<torch::optim::AdamW>(net.parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  };
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  auto optimizer = makeAdamW(*net);
  ddp::GradScaler scaler(group(), options);
  ddp::Checkpointer checkpointer(group(), {dir});
  step(model, *optimizer, scaler);
  step(model, *optimizer, scaler);  // the second finite step: the scale grows to 2048
  step(model, *optimizer, scaler);
  const std::string path = checkpointer.save(*net, *optimizer, {0, 3, 3, 18}, &scaler);
  EXPECT_EQ(scaler.getScale(), 2048.0);
  EXPECT_EQ(scaler.stateDict()->growthTracker, 1);
  step(model, *optimizer, scaler);
  const auto expected = flatParams(*net);
  EXPECT_EQ(scaler.getScale(), 4096.0);

  torch::manual_seed(99);
  Net fresh;
  ddp::DistributedDataParallel<Net> freshModel(fresh, group());
  auto freshOptimizer = makeAdamW(*fresh);
  ddp::GradScaler freshScaler(group(), options);
  ddp::Checkpointer again(group(), {dir});
  ASSERT_TRUE(again.resume(*fresh, *freshOptimizer, &freshScaler).has_value());
  EXPECT_EQ(freshScaler.getScale(), 2048.0);
  step(freshModel, *freshOptimizer, freshScaler);
  EXPECT_TRUE(torch::equal(flatParams(*fresh), expected));
  EXPECT_EQ(freshScaler.getScale(), 4096.0);
  // An SGD cannot take Adam's state: one CheckpointError, nothing changed.
  torch::optim::SGD sgd(fresh->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_THROW(again.resumeFrom(path, *fresh, sgd), ddp::CheckpointError);
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

// The found-inf flag is agreed on over the group: a gradient that overflows on one rank only
// (gradients outside DDP, so nothing averages them) makes every rank skip the step and back off.
TEST(GradScaler, EveryRankSkipsTheStepOneRankOverflowed) {
  auto p = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.5));
  ddp::GradScaler scaler(group(), {256.0});
  const bool lastRank = group().rank() == group().size() - 1;
  for (int i = 0; i < 2; ++i) {
    sgd.zero_grad();
    auto g = torch::full({4}, 1.0);
    if (i == 0 && lastRank) g[1] = INFINITY;
    scaler.scale((p * g).sum()).backward();
    scaler.step(sgd);
    scaler.update();
    const bool stepped = scaler.foundInf().item<float>() == 0.0f;
    EXPECT_EQ(stepped, i == 1) << "iteration " << i;
    EXPECT_EQ(scaler.getScale(), 128.0) << "iteration " << i;  // backed off once, then one finite step
  }
  EXPECT_TRUE(torch::equal(p.detach(), torch::full({4}, 0.5)));  // only the second step: 1 - 0.5 · 1
  EXPECT_TRUE(equalOnAllRanks(p));
}

TEST(Checkpointer, NothingToResumeIsNullopt) {
  const std::string dir = scratchDir("empty");
  Net net;
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  ddp::Checkpointer checkpointer(group(), {dir});
  EXPECT_FALSE(checkpointer.resume(*net, optimizer).has_value());
  ddp::CheckpointOptions bad;
  bad.keepLast = -1;
  EXPECT_THROW(ddp::Checkpointer(group(), bad), ddp::ConfigError);
}

// The checkpoint files in `dir`, by name.
std::vector<std::string> checkpointNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& path : ddp::listCheckpoints(dir)) names.push_back(std::filesystem::path(path).filename().string());
  return names;
}

// keepLast counts and deletes only this run's checkpoints: a fresh run's own saves were pruned by
// another run's higher steps (ckpt-1 ranked below ckpt-200) or pruned theirs. "This run" is this
// process, whichever Checkpointer saved (one made for each save kept them all). After a resume, the
// checkpoint resumed from and the older ones are this run's. Another run's checkpoints: copies,
// into this directory, of files this process wrote elsewhere.
TEST(Checkpointer, KeepLastCountsOnlyThisRunsCheckpoints) {
  const std::string dir = scratchDir("keep_own"), elsewhere = scratchDir("keep_other");
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(elsewhere);
  }
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  ddp::CheckpointOptions options;
  options.keepLast = 2;
  options.dir = elsewhere;
  {
    ddp::Checkpointer earlier(group(), options);
    for (int64_t step : {100, 200}) earlier.save(*net, sgd, {0, step, step, step});
  }
  if (group().rank() == 0) {
    std::filesystem::create_directories(dir);
    for (const char* name : {"ckpt-00000100.pt", "ckpt-00000200.pt"}) {
      std::filesystem::copy_file(elsewhere + "/" + name, dir + "/" + name);
    }
  }
  group().barrier();
  options.dir = dir;
  for (int64_t step : {1, 2, 3}) ddp::Checkpointer(group(), options).save(*net, sgd, {0, step, step, step});
  group().barrier();
  const std::vector<std::string> kept = {"ckpt-00000002.pt", "ckpt-00000003.pt", "ckpt-00000100.pt", "ckpt-00000200.pt"};
  EXPECT_EQ(checkpointNames(dir), kept);

  ddp::Checkpointer resumed(group(), options);
  const auto position = resumed.resume(*net, sgd);
  ASSERT_TRUE(position.has_value());
  EXPECT_EQ(position->globalStep, 200);
  resumed.save(*net, sgd, {0, 201, 201, 201});
  group().barrier();
  EXPECT_EQ(checkpointNames(dir), (std::vector<std::string>{"ckpt-00000200.pt", "ckpt-00000201.pt"}));
  group().barrier();
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(elsewhere);
  }
}

// Ranks seeded apart (dropout, augmentation) draw apart; a resume gives each its own CPU generator
// back (every rank drew rank 0's numbers after it), so steps 3 and 4 draw what they drew before.
// Every rank must save the same position: another rank's step is a ConfigError on every rank.
TEST(Checkpointer, EachRankResumesItsOwnCpuGeneratorAndAllSaveOneStep) {
  const std::string dir = scratchDir("rng");
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  torch::manual_seed(100 + group().rank());
  ddp::Checkpointer checkpointer(group(), {dir});
  std::vector<double> straight;
  for (int64_t step = 1; step <= 4; ++step) {
    straight.push_back(torch::rand({1}).item<double>());
    if (step == 2) checkpointer.save(*net, sgd, {0, step, step, step});
  }
  torch::manual_seed(7);  // anything: the resume sets it
  ddp::Checkpointer again(group(), {dir});
  ASSERT_EQ(again.resume(*net, sgd).value_or(ddp::TrainPosition{}).globalStep, 2);
  for (size_t i = 2; i < 4; ++i) EXPECT_EQ(torch::rand({1}).item<double>(), straight[i]) << "step " << i + 1;
  if (group().size() > 1) {
    try {
      again.save(*net, sgd, {0, 10 + group().rank(), 10 + group().rank(), 10});
      ADD_FAILURE() << "saved with a different step on each rank";
    } catch (const ddp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("the ranks save different positions (rank " + std::to_string(group().rank()) +
                                           " has globalStep " + std::to_string(10 + group().rank()) + ")"),
                std::string::npos)
          << e.what();
    }
  }
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

// Resume takes the highest step: a save below this Checkpointer's last save, or its resume from its
// own directory, would never be resumed from, and is refused on every rank before anything is
// written. A checkpoint resumed from elsewhere (a run to fine-tune from) does not count.
TEST(Checkpointer, ASaveBelowTheLastStepIsRefused) {
  const std::string dir = scratchDir("lower"), other = scratchDir("lower_other");
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(other);
  }
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  ddp::Checkpointer checkpointer(group(), {dir});
  checkpointer.save(*net, sgd, {0, 5, 5, 5});
  try {
    checkpointer.save(*net, sgd, {0, 3, 3, 3});
    ADD_FAILURE() << "saved step 3 after step 5";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("step 3 after step 5"), std::string::npos) << e.what();
  }
  ddp::Checkpointer resumed(group(), {dir});
  ASSERT_EQ(resumed.resume(*net, sgd).value_or(ddp::TrainPosition{}).globalStep, 5);
  EXPECT_THROW(resumed.save(*net, sgd, {0, 4, 4, 4}), ddp::ConfigError);
  ddp::Checkpointer fineTune(group(), {other});
  (void)fineTune.resumeFrom(dir + "/ckpt-00000005.pt", *net, sgd);
  EXPECT_EQ(std::filesystem::path(fineTune.save(*net, sgd, {0, 1, 1, 1})).filename(), "ckpt-00000001.pt");
  group().barrier();
  EXPECT_EQ(checkpointNames(dir), std::vector<std::string>{"ckpt-00000005.pt"});
  EXPECT_EQ(checkpointNames(other), std::vector<std::string>{"ckpt-00000001.pt"});
  group().barrier();
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(other);
  }
}

// A directory another job holds (its lock file, here held by flock(1) and naming pid 4242): every
// rank's save is refused before anything is written; once the other job is gone, the save goes.
TEST(Checkpointer, ADirectoryAnotherJobHoldsIsRefused) {
  const std::string dir = scratchDir("held");
  const std::string lock = dir + "/.ddp-launch.lock";
  std::unique_ptr<ddp::test::Background> other;
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(lock) << "4242\nanother host 1\n";
    other = std::make_unique<ddp::test::Background>(
        std::vector<std::string>{"/usr/bin/flock", lock, "/bin/sh", "-c", "echo locked; exec tail -f /dev/null"}, dir + ".log");
    ASSERT_TRUE(other->waitFor("locked", 30)) << ddp::test::readFile(other->log);
  }
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  ddp::Checkpointer checkpointer(group(), {dir});
  try {
    checkpointer.save(*net, sgd, {0, 1, 1, 1});
    ADD_FAILURE() << "saved into a directory another job holds";
  } catch (const ddp::CheckpointError& e) {
    const std::string what = e.what();
    const std::string expected = group().rank() == 0
        ? "checkpoint: " + dir + " is in use by another job (pid 4242 holds " + lock + "); give each job its own "
          "ddp::CheckpointOptions::dir"
        : "checkpoint: rank 0 could not take " + dir + " for this job";
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
  EXPECT_TRUE(checkpointNames(dir).empty());
  group().barrier();
  if (group().rank() == 0) {
    ::kill(-other->pid, SIGKILL);
    EXPECT_EQ(other->wait(30), 128 + SIGKILL);
  }
  group().barrier();
  EXPECT_EQ(std::filesystem::path(checkpointer.save(*net, sgd, {0, 1, 1, 1})).filename(), "ckpt-00000001.pt");
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  if (group().rank() == 0) std::filesystem::remove(dir + ".log");
}

TEST(Export, RankZeroWritesPlainKeysThatLoadBack) {
  const std::string dir = scratchDir("export");
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  torch::manual_seed(6);
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  ddp::saveModel(*net, dir + "/model.pt", group());
  Net loaded;
  ddp::loadModel(*loaded, dir + "/model.pt");
  EXPECT_TRUE(torch::equal(flatParams(*loaded), flatParams(*net)));
  torch::nn::Linear other(2, 2);
  EXPECT_THROW(ddp::loadModel(*other, dir + "/model.pt"), ddp::CheckpointError);
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Shutdown, DestroyIsCollectiveAndFinal) {
  // Last: the group is gone afterwards.
  group().destroy();
  EXPECT_TRUE(group().destroyed());
  group().destroy();  // idempotent
  EXPECT_EQ(group().size(), std::getenv("WORLD_SIZE") ? std::atoi(std::getenv("WORLD_SIZE")) : 1);  // still answers
  auto t = torch::ones({1});
  EXPECT_THROW(group().allReduce(t), ddp::ConfigError);
}

}  // namespace
