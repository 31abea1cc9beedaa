// Exact-resume building blocks: momentum buffers and RNG state survive a save/restore.
#include <gtest/gtest.h>

#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "common/error.h"
#include "libddp/checkpoint/optimizer_state.h"
#include "worker/models/models.h"

namespace ddp::checkpoint {
namespace {

NamedTensors named(torch::nn::Module& m) {
  NamedTensors out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void step(worker::Mlp& model, torch::optim::SGD& opt, const at::Tensor& x, const at::Tensor& y) {
  opt.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  opt.step();
}

TEST(OptimizerState, RestoredMomentumContinuesBitwiseLikeTheOriginal) {
  torch::manual_seed(1);
  const worker::InputSpec in{1, 4, 4, 3};
  worker::Mlp a(in, std::vector<int64_t>{5});
  torch::optim::SGD optA(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const at::Tensor x = at::randn({8, 1, 4, 4});
  const at::Tensor y = at::randint(0, 3, {8});
  step(a, optA, x, y);
  step(a, optA, x, y);

  // A fresh replica gets a's weights and momentum, as a resumed run does.
  worker::Mlp b(in, std::vector<int64_t>{5});
  {
    c10::NoGradGuard noGrad;
    for (auto& [name, p] : named(*b)) p.copy_(a->named_parameters()[name]);
  }
  torch::optim::SGD optB(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const NamedTensors buffers = sgdMomentumBuffers(optA, named(*a));
  ASSERT_EQ(buffers.size(), 4u);  // fc1, fc2: weight and bias
  EXPECT_EQ(buffers[0].first.rfind("momentum_buffer.", 0), 0u);
  restoreSgdMomentumBuffers(optB, named(*b), buffers, "test");

  step(a, optA, x, y);
  step(b, optB, x, y);
  for (auto& [name, p] : named(*a)) EXPECT_TRUE(at::equal(p, b->named_parameters()[name])) << name;

  // Without the momentum the next step differs: the test can tell.
  worker::Mlp c(in, std::vector<int64_t>{5});
  {
    c10::NoGradGuard noGrad;
    for (auto& [name, p] : named(*c)) p.copy_(b->named_parameters()[name]);
  }
  torch::optim::SGD optC(c->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  step(b, optB, x, y);
  step(c, optC, x, y);
  EXPECT_FALSE(at::equal(named(*b)[0].second, named(*c)[0].second));
}

TEST(OptimizerState, WrongBuffersAreRefused) {
  worker::Mlp a(worker::InputSpec{1, 4, 4, 3}, std::vector<int64_t>{5});
  torch::optim::SGD opt(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_THROW(restoreSgdMomentumBuffers(opt, named(*a), {{"momentum_buffer.fc9.weight", at::randn({2})}}, "x"),
               CheckpointError);
  EXPECT_THROW(restoreSgdMomentumBuffers(opt, named(*a), {{"momentum_buffer.fc1.weight", at::randn({2})}}, "x"),
               CheckpointError);
}

TEST(OptimizerState, CpuRngStateRoundTrips) {
  torch::manual_seed(7);
  const at::Tensor state = cpuRngState();
  const at::Tensor first = at::randn({5});
  setCpuRngState(state);
  EXPECT_TRUE(at::equal(first, at::randn({5})));
}

}  // namespace
}  // namespace ddp::checkpoint
