// DistributedDataParallel through the public library (see api_ranks_test.cc): expected values
// come from formulas: DDP's averaged gradient is the gradient of the mean loss over the union of the
// shards, computed here on the whole batch by an unwrapped copy.
#include "tests/libddp/api_ranks_support.h"

#include <ATen/record_function.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace api_ranks {
namespace {

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

// Ranks that wrap different models (PyTorch checks them at construction too: "params[0] in this
// process with sizes [5, 4] appears not to match ..."): one ConfigError on every rank, naming the
// first difference, before any broadcast pairs tensors of different sizes (which Gloo aborts on).
std::string constructionError(torch::nn::Module& module) {
  try {
    ddp::DdpEngine engine(module, group());
  } catch (const ddp::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DistributedDataParallel, RanksWrappingDifferentModelsAreOneLineOnEveryRank) {
  const bool other = group().rank() == 1;
  torch::nn::Linear wider(4, other ? 5 : 3);
  if (group().size() == 1) {  // alone (api_single): nothing to compare, no collective
    EXPECT_EQ(constructionError(*wider), "");
    return;
  }
  EXPECT_EQ(constructionError(*wider),
            "ddp::DistributedDataParallel: the ranks wrap different models: parameter 'weight' (parameters[0] in this "
            "rank's model) is [3, 4] Float requiring grad on rank 0 but [5, 4] Float requiring grad on rank 1; every "
            "rank must build the same model before wrapping it");
  torch::nn::Linear frozen(4, 3);
  if (other) frozen->bias.set_requires_grad(false);
  EXPECT_EQ(constructionError(*frozen),
            "ddp::DistributedDataParallel: the ranks wrap different models: parameter 'bias' (parameters[1] in this "
            "rank's model) is [3] Float requiring grad on rank 0 but [3] Float on rank 1; every rank must build the "
            "same model before wrapping it");
  torch::nn::Sequential deeper(torch::nn::Linear(4, 4));
  if (other) deeper->push_back(torch::nn::BatchNorm1d(4));
  EXPECT_EQ(constructionError(*deeper),
            "ddp::DistributedDataParallel: the ranks wrap different models: rank 0's has 2 parameters and 0 buffers, "
            "rank 1's 4 and 3; every rank must build the same model before wrapping it");
  torch::nn::Linear same(4, 3);
  EXPECT_EQ(constructionError(*same), "");  // and the group still pairs its collectives
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

// A model cast after it was wrapped has new AccumulateGrad nodes, without DDP's hooks: its gradients
// stayed each rank's and the replicas drifted apart silently (a reviewer's 3 steps: not equal). The
// first forward after the cast is refused on every rank (api_ddp), naming the parameter and its new type.
TEST(DistributedDataParallel, AModelCastAfterWrappingIsRefused) {
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  const auto x = torch::randn({2, 5});
  torch::mse_loss(model(x), torch::zeros({2, 3})).backward();  // wrapped as it is: fine
  net->to(torch::kDouble);
  if (group().size() == 1) {  // alone (api_single): no gradient is reduced, no replica to drift from
    EXPECT_NO_THROW((void)model(x.to(torch::kDouble)));
    return;
  }
  try {
    (void)model(x.to(torch::kDouble));
    ADD_FAILURE() << "a forward of the cast model went on";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("was replaced after the model was wrapped"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(it is now Double on cpu)"), std::string::npos) << e.what();
  }
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

}  // namespace
}  // namespace api_ranks
