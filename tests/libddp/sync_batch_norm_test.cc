// ddp::SyncBatchNorm against its definition: N ranks, each with its part of a batch, must compute
// what LibTorch's own torch::nn::BatchNorm computes on the whole batch in one process (outputs,
// input gradients, weight/bias gradients, running statistics), uneven parts included; and under
// DDP, several SGD steps end with the parameters and running statistics of the one-process run.
// Run under ddp-launch with 2 and 3 ranks (Gloo and shm: DDP_TEST_BACKEND) and alone.
#include <ddp/ddp.h>
#include <ddp/sync_batch_norm.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

ddp::ProcessGroup& group() {
  static ddp::ProcessGroup g = [] {
    ddp::InitOptions options;
    const char* backend = std::getenv("DDP_TEST_BACKEND");
    if (backend != nullptr) options.backend = ddp::parseBackend(backend).value();
    options.timeout = std::chrono::seconds(60);
    return ddp::initProcessGroup(options);
  }();
  return g;
}

// This rank's rows of `whole` when rank r holds `sizes[r]` consecutive rows.
torch::Tensor part(const torch::Tensor& whole, const std::vector<int64_t>& sizes) {
  int64_t start = 0;
  for (int r = 0; r < group().rank(); ++r) start += sizes[r];
  return whole.narrow(0, start, sizes[group().rank()]);
}

torch::Tensor summed(torch::Tensor t) {
  t = t.clone();
  group().allReduce(t);
  return t;
}

// Uneven parts (rank r holds 3 + 5r rows; the last rank none when there are three): the count-weighted
// merge must give the whole batch's statistics, and backward the whole batch's gradients.
TEST(SyncBatchNorm, UnevenPartsComputeWhatBatchNormComputesOnTheWholeBatch) {
  const int world = group().size();
  std::vector<int64_t> sizes;
  for (int r = 0; r < world; ++r) sizes.push_back(world == 3 && r == 2 ? 0 : 3 + 5 * r);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  torch::manual_seed(7);
  const auto x = torch::randn({total, 4, 3, 2}) * 3 + 1;
  const auto g = torch::randn({total, 4, 3, 2});  // d loss / d output

  torch::nn::BatchNorm2d reference(torch::nn::BatchNormOptions(4).momentum(0.3));
  ddp::SyncBatchNorm sync(torch::nn::BatchNormOptions(4).momentum(0.3), group());
  {
    torch::NoGradGuard noGrad;
    for (auto* m : {&reference->weight, &sync->weight}) m->copy_(torch::linspace(0.5, 2, 4));
    for (auto* m : {&reference->bias, &sync->bias}) m->copy_(torch::linspace(-1, 1, 4));
  }
  const auto xWhole = x.clone().requires_grad_();
  const auto expected = reference(xWhole);
  (expected * g).sum().backward();

  const auto xMine = part(x, sizes).clone().requires_grad_();
  const auto out = sync(xMine);
  (out * part(g, sizes)).sum().backward();

  EXPECT_TRUE(torch::allclose(out, part(expected, sizes), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(xMine.grad(), part(xWhole.grad(), sizes), 1e-5, 1e-5));
  // Each rank's weight/bias gradient is its part's: their sum is the whole batch's.
  EXPECT_TRUE(torch::allclose(summed(sync->weight.grad()), reference->weight.grad(), 1e-5, 1e-4));
  EXPECT_TRUE(torch::allclose(summed(sync->bias.grad()), reference->bias.grad(), 1e-5, 1e-4));
  EXPECT_TRUE(torch::allclose(sync->running_mean, reference->running_mean, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(sync->running_var, reference->running_var, 1e-5, 1e-6));
  EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), 1);

  // Eval: the running statistics, no collective (rank 0 alone may evaluate).
  sync->eval();
  reference->eval();
  if (group().rank() == 0) {
    torch::NoGradGuard noGrad;
    EXPECT_TRUE(torch::allclose(sync(x), reference(x), 1e-5, 1e-5));
  }
}

// affine(false) (no weight and bias) and track_running_stats(false) (no running statistics: batch
// statistics in eval too), as LibTorch's BatchNorm computes them on the whole batch.
void expectWholeBatchNorm(bool affine, bool track) {
  SCOPED_TRACE(std::string(affine ? "affine" : "no affine") + (track ? ", tracked" : ", untracked"));
  const int world = group().size();
  const int64_t each = 3;
  torch::manual_seed(11);
  const auto x = torch::randn({each * world, 4, 5}) * 2 - 1;
  const auto g = torch::randn({each * world, 4, 5});
  const auto options = torch::nn::BatchNormOptions(4).affine(affine).track_running_stats(track);
  torch::nn::BatchNorm1d reference(options);
  ddp::SyncBatchNorm sync(options, group());
  EXPECT_EQ(sync->weight.defined(), affine);
  EXPECT_EQ(sync->running_mean.defined(), track);
  const auto xWhole = x.clone().requires_grad_();
  const auto expected = reference(xWhole);
  (expected * g).sum().backward();
  const std::vector<int64_t> sizes(world, each);
  const auto xMine = part(x, sizes).clone().requires_grad_();
  const auto out = sync(xMine);
  (out * part(g, sizes)).sum().backward();
  EXPECT_TRUE(torch::allclose(out, part(expected, sizes), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(xMine.grad(), part(xWhole.grad(), sizes), 1e-5, 1e-5));
  if (affine) {
    EXPECT_TRUE(torch::allclose(summed(sync->weight.grad()), reference->weight.grad(), 1e-5, 1e-4));
    EXPECT_TRUE(torch::allclose(summed(sync->bias.grad()), reference->bias.grad(), 1e-5, 1e-4));
  }
  if (track) {
    EXPECT_TRUE(torch::allclose(sync->running_mean, reference->running_mean, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(sync->running_var, reference->running_var, 1e-5, 1e-6));
  } else {  // eval without running statistics: this rank's batch statistics (Python: no sync in eval)
    sync->eval();
    reference->eval();
    torch::NoGradGuard noGrad;
    EXPECT_TRUE(torch::allclose(sync(part(x, sizes)), reference(part(x, sizes)), 1e-5, 1e-5));
  }
}

// (A loop, not a parameterised test: those would run after Shutdown.Destroy.)
TEST(SyncBatchNorm, WithoutAffineOrRunningStatisticsComputesWhatBatchNormComputesOnTheWholeBatch) {
  expectWholeBatchNorm(/*affine=*/false, /*track=*/true);
  expectWholeBatchNorm(/*affine=*/true, /*track=*/false);
  expectWholeBatchNorm(/*affine=*/false, /*track=*/false);
}

struct NetImpl : torch::nn::Module {
  torch::nn::Conv2d conv{nullptr};
  torch::nn::AnyModule norm;
  torch::nn::Linear fc{nullptr};
  explicit NetImpl(bool synced) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 6, 3).padding(1)));
    if (synced) {
      norm = torch::nn::AnyModule(register_module("bn", ddp::SyncBatchNorm(6, group())));
    } else {
      norm = torch::nn::AnyModule(register_module("bn", torch::nn::BatchNorm2d(6)));
    }
    fc = register_module("fc", torch::nn::Linear(6 * 4 * 4, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc(torch::relu(norm.forward(conv(x))).flatten(1));
  }
};
TORCH_MODULE(Net);

// The case: world × batch 32 with SyncBatchNorm under DDP = one process with batch 32 × world,
// parameters and running statistics, over 5 SGD steps.
TEST(SyncBatchNorm, UnderDdpEqualsOneProcessWithTheWholeBatch) {
  const int world = group().size();
  torch::manual_seed(3);
  Net synced(true);
  Net reference(false);
  {
    torch::NoGradGuard noGrad;
    auto from = reference->named_parameters();
    for (auto& p : synced->named_parameters()) p.value().copy_(from[p.key()]);
  }
  ddp::DistributedDataParallel model(synced, group());
  torch::optim::SGD optimizer(synced->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD referenceOptimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const std::vector<int64_t> sizes(static_cast<size_t>(world), 32);
  for (int step = 0; step < 5; ++step) {
    const auto x = torch::randn({32 * world, 2, 4, 4});
    const auto y = torch::randint(0, 3, {32 * world});
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(model(part(x, sizes)), part(y, sizes)).backward();
    optimizer.step();
    referenceOptimizer.zero_grad();
    torch::nn::functional::cross_entropy(reference(x), y).backward();
    referenceOptimizer.step();
  }
  auto expected = reference->named_parameters();
  for (const auto& p : synced->named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), expected[p.key()], 1e-5, 1e-5)) << p.key();
  }
  auto expectedBuffers = reference->named_buffers();
  for (const auto& b : synced->named_buffers()) {
    EXPECT_TRUE(torch::allclose(b.value().to(torch::kDouble), expectedBuffers[b.key()].to(torch::kDouble), 1e-5, 1e-5))
        << b.key();
  }
}

// A layer called through the registry is converted (sharing its tensors, so an optimizer made
// before keeps them); one also held by a member would keep running the old layer: refused, named.
struct ByRegistryImpl : torch::nn::Module {
  ByRegistryImpl() {
    register_module("fc", torch::nn::Linear(3, 4));
    register_module("bn", torch::nn::BatchNorm1d(4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto children = named_children();
    return children["bn"]->as<ddp::SyncBatchNorm>() != nullptr
               ? children["bn"]->as<ddp::SyncBatchNorm>()->forward(children["fc"]->as<torch::nn::Linear>()->forward(x))
               : children["bn"]->as<torch::nn::BatchNorm1d>()->forward(children["fc"]->as<torch::nn::Linear>()->forward(x));
  }
};

struct ByMemberImpl : torch::nn::Module {
  torch::nn::Sequential body{nullptr};
  ByMemberImpl() {
    register_module("extra", torch::nn::BatchNorm1d(2));  // convertible, but comes first: must stay
    body = register_module("body", torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4)));
  }
};

TEST(ConvertSyncBatchNorm, ReplacesRegisteredLayersAndRefusesHeldOnes) {
  auto model = std::make_shared<ByRegistryImpl>();
  const torch::Tensor weightBefore = model->named_parameters()["bn.weight"];
  EXPECT_EQ(ddp::convertSyncBatchNorm(*model, group()), 1);
  EXPECT_NE(model->named_children()["bn"]->as<ddp::SyncBatchNorm>(), nullptr);
  EXPECT_TRUE(model->named_parameters()["bn.weight"].is_same(weightBefore));
  EXPECT_EQ(model->forward(torch::randn({5, 3})).sizes(), (std::vector<int64_t>{5, 4}));

  ByMemberImpl held;
  try {
    ddp::convertSyncBatchNorm(held, group());
    ADD_FAILURE() << "a Sequential's BatchNorm was converted";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'body.1'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("declare that layer as ddp::SyncBatchNorm(4, group)"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(held.named_children()["extra"]->as<torch::nn::BatchNorm1d>(), nullptr) << "a refused conversion changed the model";
}

TEST(SyncBatchNorm, WrongInputIsAConfigError) {
  ddp::SyncBatchNorm sync(4, group());
  EXPECT_THROW(sync(torch::randn({8, 5})), ddp::ConfigError);
  EXPECT_THROW(sync(torch::randn({8})), ddp::ConfigError);
}

TEST(Shutdown, Destroy) { group().destroy(); }

}  // namespace
