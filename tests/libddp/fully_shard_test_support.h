// The model, batches and helpers of the ddp::fullyShard tests (fully_shard_test.cc,
// fully_shard_features_test.cc; one program under ddp-launch, 2 or 3 ranks, DDP_TEST_BACKEND): a
// model with parameters whose dim 0 the world does not divide (padding; on 3 ranks a rank with
// zero rows), each block a unit, then the root, and PyTorch's own FSDP2 on the same weights and
// batches (tests/python/fsdp_reference.py).
#pragma once

#include <ddp/ddp.h>
#include <ddp/fully_shard.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tests/support/run_command.h"

namespace fsdp_test {

inline std::optional<ddp::ProcessGroup> theGroup;
inline ddp::ProcessGroup& group() { return *theGroup; }

constexpr int kSteps = 4;
constexpr int64_t kBatch = 4;  // per rank

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc1(register_module("fc1", torch::nn::Linear(7, 4))), fc2(register_module("fc2", torch::nn::Linear(4, 7))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

// tests/python/fsdp_reference.py's Net, parameter for parameter. runBlock lets a test send each
// block through its unit (LibTorch modules have no forward hooks).
struct NetImpl : torch::nn::Module {
  NetImpl()
      : inp(register_module("inp", torch::nn::Linear(5, 7))),
        blocks(register_module("blocks", torch::nn::ModuleList(Block(), Block()))),
        head(register_module("head", torch::nn::Linear(7, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(inp(x));
    for (size_t i = 0; i < blocks->size(); ++i) x = runBlock ? runBlock(i, x) : block(i)->forward(x);
    return head(x);
  }
  std::shared_ptr<BlockImpl> block(size_t i) { return blocks->ptr<BlockImpl>(i); }
  torch::nn::Linear inp;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
  std::function<torch::Tensor(size_t, const torch::Tensor&)> runBlock;
};
TORCH_MODULE(Net);

inline Net makeNet() {
  torch::manual_seed(3);
  return Net();
}

inline std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank) {
  torch::manual_seed(1000 + 10 * step + rank);
  torch::Tensor x = torch::randn({kBatch, 5});
  torch::Tensor y = torch::randn({kBatch, 3});
  return {x, y};
}

using Params = std::map<std::string, torch::Tensor>;
using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

inline MakeOptimizer sgd() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  };
}
inline MakeOptimizer adamw() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  };
}

inline Params trainDdp(const MakeOptimizer& make) {
  Net net = makeNet();
  ddp::DistributedDataParallel<Net> model(net, group());
  auto optimizer = make(net->parameters());
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s, group().rank());
    optimizer->zero_grad();
    torch::mse_loss(model(x).to(y.scalar_type()), y).backward();
    optimizer->step();
  }
  Params out;
  for (const auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// The model sharded as FSDP2 users do: each block, then the root.
struct Sharded {
  explicit Sharded(ddp::FullyShardOptions options = {}) : net(makeNet()) {
    for (size_t i = 0; i < net->blocks->size(); ++i) blocks.push_back(ddp::fullyShard(*net->block(i), group(), options));
    root.emplace(ddp::fullyShard(*net, group(), options));
    net->runBlock = [this](size_t i, const torch::Tensor& x) {
      return blocks[i].forward([&](const torch::Tensor& h) { return net->block(i)->forward(h); }, x);
    };
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return root->forward([&](const torch::Tensor& h) { return net->forward(h); }, x);
  }
  // Every parameter's full value (FSDP2's full_tensor()), the shards left as they were.
  Params fullParameters() {
    for (auto& b : blocks) b.unshard();
    root->unshard();
    Params out;
    for (const auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
    for (auto& b : blocks) b.reshard();
    root->reshard();
    return out;
  }
  Net net;
  std::vector<ddp::FullyShardedUnit> blocks;
  std::optional<ddp::FullyShardedUnit> root;
};

// The full parameters from the shards as they are (fp32 under a bf16 paramDtype, where unshard()
// gathers bf16): each rank's rows padded to c = ceil(dim0 / world), all-gathered, cut to dim0.
inline Params gatherShards(Sharded& model) {
  Params out;
  auto add = [&](const ddp::FullyShardedUnit& unit, const std::string& prefix) {
    const auto params = unit.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<int64_t> padded = unit.fullShape(i);
      const int64_t rows = padded[0];
      padded[0] = (rows + group().size() - 1) / group().size();
      torch::Tensor chunk = torch::zeros(padded);
      chunk.narrow(0, 0, params[i].size(0)).copy_(params[i].detach());
      out[prefix + unit.parameterNames()[i]] = torch::cat(group().allGather(chunk)).narrow(0, 0, rows);
    }
  };
  for (size_t b = 0; b < model.blocks.size(); ++b) add(model.blocks[b], "blocks." + std::to_string(b) + ".");
  add(*model.root, "");
  return out;
}

inline Params trainFsdp(const MakeOptimizer& make, ddp::FullyShardOptions options = {}) {
  Sharded model(options);
  auto optimizer = make(model.net->parameters());
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s, group().rank());
    optimizer->zero_grad();
    torch::mse_loss(model.forward(x).to(y.scalar_type()), y).backward();
    optimizer->step();
  }
  return options.paramDtype ? gatherShards(model) : model.fullParameters();
}

// ZeRO-2 on the same machinery: parameters gathered once per step and kept, gradients and
// optimizer state sharded.
inline ddp::FullyShardOptions zero2(ddp::FullyShardOptions options = {}) {
  options.replicateParameters = true;
  return options;
}

inline double maxDiff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "no parameter " << name;
      continue;
    }
    EXPECT_EQ(t.numel(), it->second.numel()) << name;  // the reference's are flat
    d = std::max(d, (t - it->second.view(t.sizes())).abs().max().item<double>());
  }
  return d;
}

// Strings travel as bytes from rank 0 (the reference runs once, on rank 0).
inline std::string broadcastString(std::string text) {
  torch::Tensor size = torch::tensor({static_cast<int64_t>(text.size())}, torch::kLong);
  group().broadcast(size, 0);
  torch::Tensor bytes = torch::zeros({size.item<int64_t>()}, torch::kByte);
  if (group().rank() == 0) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  group().broadcast(bytes, 0);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}

// PyTorch's FSDP2 on the same weights and batches, every run once: {"sgd": {"params": {...},
// "shapes": [per rank {name: shape}]}, "adamw": ..., "adamw_keep": ..., "sgd_bf16": ...}.
inline const nlohmann::json& reference() {
  static const nlohmann::json result = [] {
    std::string output;
    if (group().rank() == 0) {
      ddp::StateDict init = ddp::stateDict(*makeNet());
      for (int s = 0; s < kSteps; ++s) {
        for (int r = 0; r < group().size(); ++r) {
          auto [x, y] = batch(s, r);
          init["x." + std::to_string(s) + "." + std::to_string(r)] = x;
          init["y." + std::to_string(s) + "." + std::to_string(r)] = y;
        }
      }
      const auto path = std::filesystem::temp_directory_path() / ("fully_shard_test_" + std::to_string(getpid()) + ".pt");
      ddp::saveStateDict(init, path.string());
      const auto run = ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/fsdp_reference.py", path.string(),
                                              std::to_string(group().size()), std::to_string(kSteps)},
                                             ddp::test::stdoutOnly());
      std::filesystem::remove(path);
      output = run.exitCode == 0 ? run.output : "null";
    }
    return nlohmann::json::parse(broadcastString(output));
  }();
  return result;
}

inline Params referenceParams(const std::string& run) {
  Params out;
  for (const auto& [name, values] : reference().at(run).at("params").items()) {
    out[name] = torch::tensor(values.get<std::vector<float>>());
  }
  return out;
}

}  // namespace fsdp_test
