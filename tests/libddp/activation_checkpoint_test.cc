// ddp::activationCheckpoint (torch.utils.checkpoint for LibTorch): checkpointing changes where the
// activations come from, not the arithmetic, so every gradient equals the plain forward's to the
// bit (CPU), dropout included (the recompute draws the forward's masks), under DDP with and without
// findUnusedParameters; BatchNorm statistics are updated once; misuse is a ConfigError. Runs alone
// and as 2 ranks under ddp-launch (api_activation_checkpoint, _ddp).
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace {

std::optional<ddp::ProcessGroup> theGroup;
ddp::ProcessGroup& group() {
  if (!theGroup) theGroup.emplace(ddp::initProcessGroup());
  return *theGroup;
}

// nanoGPT's block in small: pre-norm MLP with dropout on a residual.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})))),
        fc(register_module("fc", torch::nn::Linear(8, 32))),
        proj(register_module("proj", torch::nn::Linear(32, 8))),
        drop(register_module("drop", torch::nn::Dropout(0.2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + drop(proj(torch::gelu(fc(ln(x))))); }
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc, proj;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() : inp(register_module("inp", torch::nn::Linear(5, 8))), head(register_module("head", torch::nn::Linear(8, 3))) {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("b" + std::to_string(i), Block()));
  }
  torch::Tensor forward(const torch::Tensor& input) {
    torch::Tensor x = inp(input);
    for (auto& b : blocks) {
      x = checkpointed ? ddp::activationCheckpoint(*b, [m = b.ptr()](const torch::Tensor& h) { return m->forward(h); }, x, options)
                       : b->forward(x);
    }
    return head(x);
  }
  torch::nn::Linear inp, head;
  std::vector<Block> blocks;
  bool checkpointed = false;
  ddp::ActivationCheckpointOptions options;
};
TORCH_MODULE(Net);

Net makeNet(bool checkpointed) {
  torch::manual_seed(3);
  Net net;
  net->checkpointed = checkpointed;
  return net;
}

// The parameters' gradients after one forward and backward from one random state, and the next
// number the generator gives after it (the recompute must leave the generator where it found it).
struct Result {
  std::vector<torch::Tensor> grads;
  double nextRandom = 0;
};
template <typename Model>
Result gradients(Net& net, Model& model, int rank) {
  torch::manual_seed(100 + rank);
  const torch::Tensor x = torch::randn({6, 5}), y = torch::randn({6, 3});
  torch::mse_loss(model(x), y).backward();
  Result r;
  for (const auto& p : net->parameters()) r.grads.push_back(p.grad().clone());
  r.nextRandom = torch::rand({1}).item<double>();
  return r;
}
// How many nodes of `out`'s graph have this name.
int nodesNamed(const torch::Tensor& out, const std::string& name) {
  std::vector<torch::autograd::Node*> todo{out.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int n = 0;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    n += node->name() == name ? 1 : 0;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return n;
}
bool sameGradients(const Result& a, const Result& b) {
  if (a.grads.size() != b.grads.size()) return false;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    if (!torch::equal(a.grads[i], b.grads[i])) return false;
  }
  return true;
}

TEST(ActivationCheckpoint, GradientsAreThePlainForwardsToTheBitDropoutIncluded) {
  Net plain = makeNet(false), checkpointed = makeNet(true);
  const Result want = gradients(plain, plain, 0);
  const Result got = gradients(checkpointed, checkpointed, 0);
  EXPECT_TRUE(sameGradients(got, want));
  EXPECT_EQ(got.nextRandom, want.nextRandom);
  // What the forward keeps: the blocks' nodes (GELU's, each holding its input) only without.
  const torch::Tensor x = torch::randn({6, 5});
  EXPECT_EQ(nodesNamed(plain->forward(x), "GeluBackward0"), 3);
  EXPECT_EQ(nodesNamed(checkpointed->forward(x), "GeluBackward0"), 0);
  // Without the forward's random state, the recompute draws other dropout masks: other gradients.
  Net unpreserved = makeNet(true);
  unpreserved->options.preserveRngState = false;
  EXPECT_FALSE(sameGradients(gradients(unpreserved, unpreserved, 0), want));
}

TEST(ActivationCheckpoint, WithoutGradModeItIsThePlainCall) {
  Net net = makeNet(true);
  c10::NoGradGuard noGrad;
  const torch::Tensor out = net->forward(torch::randn({2, 5}));
  EXPECT_FALSE(out.requires_grad());
}

TEST(ActivationCheckpoint, BatchNormStatisticsAreUpdatedOncePerForward) {
  auto run = [](bool checkpointed) {
    torch::manual_seed(7);
    torch::nn::Sequential block(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6));
    const torch::Tensor x = torch::randn({5, 4}, torch::requires_grad());
    const torch::Tensor y = checkpointed
                                ? ddp::activationCheckpoint(*block, [&](const torch::Tensor& h) { return block->forward(h); }, x)
                                : block->forward(x);
    y.pow(2).sum().backward();
    return std::make_pair(block->named_buffers(), x.grad());
  };
  const auto [want, wantGrad] = run(false);
  const auto [got, gotGrad] = run(true);
  for (const auto& b : want) EXPECT_TRUE(torch::equal(got[b.key()], b.value())) << b.key();
  EXPECT_EQ(got["1.num_batches_tracked"].item<int64_t>(), 1);
  EXPECT_TRUE(torch::equal(gotGrad, wantGrad));
}

TEST(ActivationCheckpoint, SequentialCutsAsCheckpointSequential) {
  auto run = [](int64_t segments) {
    torch::manual_seed(8);
    torch::nn::Sequential seq(torch::nn::Linear(4, 4), torch::nn::Tanh(), torch::nn::Linear(4, 4), torch::nn::Tanh(),
                              torch::nn::Linear(4, 2));
    const torch::Tensor x = torch::randn({3, 4}, torch::requires_grad());
    const torch::Tensor y = segments > 0 ? ddp::activationCheckpointSequential(*seq, segments, x) : seq->forward(x);
    y.sum().backward();
    std::vector<torch::Tensor> g{x.grad()};
    for (const auto& p : seq->parameters()) g.push_back(p.grad());
    return g;
  };
  const auto want = run(0);
  for (int64_t segments : {1, 2, 5}) {
    const auto got = run(segments);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << segments << " segments, " << i;
  }
  torch::nn::Sequential seq(torch::nn::Linear(4, 4));
  const torch::Tensor x = torch::randn({3, 4});
  EXPECT_THROW(ddp::activationCheckpointSequential(*seq, 0, x), ddp::ConfigError);
  EXPECT_THROW(ddp::activationCheckpointSequential(*seq, 2, x), ddp::ConfigError);
}

TEST(ActivationCheckpoint, AParameterOutsideTheOwnerIsAConfigErrorNotALostGradient) {
  torch::nn::Linear inside(3, 3), outside(3, 3);
  const torch::Tensor x = torch::randn({2, 3}, torch::requires_grad());
  const torch::Tensor y =
      ddp::activationCheckpoint(*inside, [&](const torch::Tensor& h) { return outside(inside(h)); }, x);
  try {
    y.sum().backward();
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {  // what the node's backward threw, through the engine
    EXPECT_NE(std::string(e.what()).find("is not a parameter of the owner module"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ddp::activationCheckpoint(*inside, nullptr, x), ddp::ConfigError);
}

TEST(ActivationCheckpoint, DdpGradientsAreThoseWithoutCheckpointing) {
  for (bool findUnused : {false, true}) {
    ddp::DdpOptions options;
    options.findUnusedParameters = findUnused;
    options.bucketCapMb = 0.001;  // several buckets
    Net plain = makeNet(false), checkpointed = makeNet(true);
    ddp::DistributedDataParallel<Net> plainModel(plain, group(), options);
    ddp::DistributedDataParallel<Net> checkpointedModel(checkpointed, group(), options);
    const Result want = gradients(plain, plainModel, group().rank());
    const Result got = gradients(checkpointed, checkpointedModel, group().rank());
    EXPECT_TRUE(sameGradients(got, want)) << "findUnusedParameters " << findUnused;
  }
}

TEST(ActivationCheckpoint, ZzDestroyTheGroup) {  // last: every rank leaves the group together
  group().destroy();
  EXPECT_TRUE(group().destroyed());
}

}  // namespace
