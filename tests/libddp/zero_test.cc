// ddp::ZeroRedundancyOptimizer (ZeRO stage 1) under ddp-launch (2 or 3 ranks, DDP_TEST_BACKEND):
// the same model trained through DDP with the sharded optimizer and with the unsharded one ends
// with the same parameters (AdamW, SGD with momentum, an lr changed through param_groups()), each
// rank holds only its shard's state, and the shards' states add up to the unsharded optimizer's.
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <optional>

#include "tests/support/run_command.h"

namespace {

std::optional<ddp::ProcessGroup> theGroup;
ddp::ProcessGroup& group() { return *theGroup; }

torch::nn::Sequential makeModel() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(20, 64), torch::nn::ReLU(), torch::nn::Linear(64, 32),
                               torch::nn::ReLU(), torch::nn::Linear(32, 5));
}

// Trains through DDP for `steps` steps with the optimizer `make` builds; halves the lr at step 3.
template <typename Make>
std::vector<torch::Tensor> train(Make make, int steps) {
  torch::nn::Sequential model = makeModel();
  ddp::DistributedDataParallel<torch::nn::Sequential> ddpModel(model, group());
  auto optimizer = make(model->parameters());
  for (int s = 0; s < steps; ++s) {
    if (s == 3) {
      for (auto& g : optimizer->param_groups()) g.options().set_lr(g.options().get_lr() / 2);
    }
    torch::manual_seed(100 * s + group().rank());
    optimizer->zero_grad();
    ddpModel(torch::randn({8, 20})).pow(2).mean().backward();
    optimizer->step();
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

double maxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

TEST(Zero, AdamWEqualsTheUnshardedOptimizer) {
  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  const auto plain = train([&](auto params) { return std::make_unique<torch::optim::AdamW>(params, adamw); }, 6);
  const auto sharded = train([&](auto params) {
    return std::make_unique<ddp::ZeroRedundancyOptimizer>(params, group(), adamw);
  }, 6);
  EXPECT_LE(maxDiff(plain, sharded), 1e-6);
}

TEST(Zero, SgdWithMomentumEqualsTheUnshardedOptimizer) {
  const auto sgd = torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true);
  const auto plain = train([&](auto params) { return std::make_unique<torch::optim::SGD>(params, sgd); }, 6);
  const auto sharded = train([&](auto params) {
    return std::make_unique<ddp::ZeroRedundancyOptimizer>(params, group(), sgd);
  }, 6);
  EXPECT_LE(maxDiff(plain, sharded), 1e-6);
}

// nanoGPT's two groups: weight decay on the >= 2-D parameters only, the rest without.
std::vector<torch::optim::OptimizerParamGroup> decayGroups(const std::vector<torch::Tensor>& params, double decay) {
  std::vector<torch::Tensor> matrices, others;
  for (const auto& p : params) (p.dim() >= 2 ? matrices : others).push_back(p);
  return {torch::optim::OptimizerParamGroup(matrices, std::make_unique<torch::optim::AdamWOptions>(
                                                          torch::optim::AdamWOptions(1e-2).weight_decay(decay))),
          torch::optim::OptimizerParamGroup(others, std::make_unique<torch::optim::AdamWOptions>(
                                                        torch::optim::AdamWOptions(1e-2).weight_decay(0)))};
}

TEST(Zero, TwoParameterGroupsEqualTheUnshardedOptimizer) {
  const auto adamw = torch::optim::AdamWOptions(1e-2);
  const auto plain = train([&](auto params) {
    return std::make_unique<torch::optim::AdamW>(decayGroups(params, 0.5), adamw);
  }, 6);
  const auto sharded = train([&](auto params) {
    return std::make_unique<ddp::ZeroRedundancyOptimizer>(decayGroups(params, 0.5), group(), adamw);
  }, 6);
  EXPECT_LE(maxDiff(plain, sharded), 1e-6);
  // The groups' decay matters: one group for all (decay everywhere) ends elsewhere.
  const auto oneGroup = train([&](auto params) {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.5));
  }, 6);
  EXPECT_GT(maxDiff(oneGroup, sharded), 1e-4);
}

// A group added after construction (PyTorch's add_param_group) is partitioned and stepped too.
TEST(Zero, AddParamGroupEqualsTheUnshardedOptimizer) {
  const auto adamw = torch::optim::AdamWOptions(1e-2);
  const auto plain = train([&](auto params) {
    return std::make_unique<torch::optim::AdamW>(decayGroups(params, 0.5), adamw);
  }, 6);
  const auto sharded = train([&](auto params) {
    auto groups = decayGroups(params, 0.5);
    auto zero = std::make_unique<ddp::ZeroRedundancyOptimizer>(groups[0].params(), group(),
                                                                torch::optim::AdamWOptions(1e-2).weight_decay(0.5));
    zero->add_param_group(groups[1]);
    return zero;
  }, 6);
  EXPECT_LE(maxDiff(plain, sharded), 1e-6);
}

TEST(Zero, EachRankHoldsItsShardsStateOnly) {
  torch::nn::Sequential model = makeModel();
  ddp::DistributedDataParallel<torch::nn::Sequential> ddpModel(model, group());
  const auto params = model->parameters();
  ddp::ZeroRedundancyOptimizer zero(params, group(), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW full(params, torch::optim::AdamWOptions(1e-3));
  zero.zero_grad();
  ddpModel(torch::randn({8, 20})).sum().backward();
  zero.step();
  // The local optimizer steps exactly the parameters owned by this rank.
  size_t owned = 0;
  int64_t ownedElements = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (zero.owner(i) == group().rank()) {
      ++owned;
      ownedElements += params[i].numel();
    }
  }
  size_t local = 0;
  for (const auto& g : zero.localOptimizer().param_groups()) local += g.params().size();
  EXPECT_EQ(local, owned);
  EXPECT_TRUE(zero.state().empty()) << "the wrapper keeps no state of its own";
  // AdamW keeps two moments per element: the rank's state is 2 × 4 bytes × its shard.
  EXPECT_EQ(zero.localStateBytes(), 2 * 4 * ownedElements);
  // Together the shards are the whole model, and the greedy partition keeps them balanced:
  // no rank holds more than the fair share plus the largest parameter.
  torch::Tensor total = torch::tensor({static_cast<double>(ownedElements)}, torch::kDouble);
  group().allReduce(total);
  int64_t all = 0, largest = 0;
  for (const auto& p : params) {
    all += p.numel();
    largest = std::max<int64_t>(largest, p.numel());
  }
  EXPECT_EQ(total.item<double>(), static_cast<double>(all));
  EXPECT_LE(ownedElements, all / group().size() + largest);
}

// The partition is PyTorch's: the owners its own _partition_parameters picks for these shapes
// (tests/python/zero_partition_reference.py), with several groups of equal sizes to break ties.
TEST(Zero, PartitionIsPyTorchs) {
  std::vector<torch::Tensor> params;
  for (auto shape : std::vector<std::vector<int64_t>>{{64, 20}, {64}, {32, 64}, {32}, {5, 32}, {5}, {7, 7}, {49}, {3}, {3}}) {
    params.push_back(torch::zeros(shape, torch::requires_grad()));
  }
  std::vector<std::string> cmd = {DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/zero_partition_reference.py",
                                  std::to_string(group().size())};
  for (const auto& p : params) {
    std::string shape;
    for (auto d : p.sizes()) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    cmd.push_back(shape);
  }
  const auto run = ddp::test::runCommand(cmd, ddp::test::stdoutOnly());
  ASSERT_EQ(run.exitCode, 0) << "zero_partition_reference.py";
  const auto owners = nlohmann::json::parse(run.output).get<std::vector<int>>();
  ddp::ZeroRedundancyOptimizer zero(params, group(), torch::optim::SGDOptions(0.1));
  ASSERT_EQ(owners.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(zero.owner(i), owners[i]) << "parameter " << i;
}

// Several groups: PyTorch carries the ranks' sizes from group to group ("|" separates the groups).
TEST(Zero, PartitionOfSeveralGroupsIsPyTorchs) {
  const std::vector<std::vector<std::vector<int64_t>>> shapes = {{{64, 20}, {32, 64}, {5, 32}}, {{64}, {32}, {5}, {49}},
                                                                 {{7, 7}, {3}, {3}}};
  std::vector<std::string> cmd = {DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/zero_partition_reference.py",
                                  std::to_string(group().size())};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& groupShapes : shapes) {
    if (!groups.empty()) cmd.push_back("|");
    std::vector<torch::Tensor> params;
    for (const auto& shape : groupShapes) {
      params.push_back(torch::zeros(shape, torch::requires_grad()));
      std::string text;
      for (auto d : shape) text += (text.empty() ? "" : "x") + std::to_string(d);
      cmd.push_back(text);
    }
    groups.emplace_back(params);
  }
  const auto run = ddp::test::runCommand(cmd, ddp::test::stdoutOnly());
  ASSERT_EQ(run.exitCode, 0) << "zero_partition_reference.py";
  const auto owners = nlohmann::json::parse(run.output).get<std::vector<int>>();
  ddp::ZeroRedundancyOptimizer zero(groups, group(), torch::optim::SGDOptions(0.1));
  ASSERT_EQ(owners.size(), 10u);
  for (size_t i = 0; i < owners.size(); ++i) EXPECT_EQ(zero.owner(i), owners[i]) << "parameter " << i;
}

TEST(Zero, MisuseIsOneLine) {
  EXPECT_THROW(ddp::ZeroRedundancyOptimizer(std::vector<torch::Tensor>{}, group(), torch::optim::SGDOptions(0.1)), ddp::ConfigError);
  torch::nn::Linear layer(2, 2);
  ddp::ZeroRedundancyOptimizer zero(layer->parameters(), group(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(zero.owner(2), ddp::ConfigError);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ddp::InitOptions options;
  if (const char* backend = std::getenv("DDP_TEST_BACKEND")) options.backend = ddp::parseBackend(backend).value();
  options.timeout = std::chrono::seconds(60);
  theGroup = ddp::initProcessGroup(options);
  torch::set_num_threads(1);
  const int rc = RUN_ALL_TESTS();
  theGroup->destroy();
  return rc;
}
