// One training run of the sharded-checkpoint tests (sharded_checkpoint_test.cc), under ddp-launch:
// a small model with dims the world sizes 2, 3 and 4 do not divide, trained as DDP or fully sharded
// (each block, then the root), on one global batch per step split over the ranks (so any world
// size takes the same mean gradient). It may resume, save once, save again at once into another
// directory (the state it loaded), and write the final full state dict.
//
//   sharded_checkpoint_program --mode full|zero2|ddp --steps N [--save-at K --dir D] [--resume PATH|auto]
//       [--resave DIR] [--out FILE] [--optimizer adamw|sgd|fused] [--hidden H]
#include <ddp/ddp.h>
#include <ddp/fully_shard.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace {

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(7, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 7))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden)
      : inp(register_module("inp", torch::nn::Linear(6, 7))),
        blocks(register_module("blocks", torch::nn::ModuleList(Block(hidden), Block(hidden)))),
        head(register_module("head", torch::nn::Linear(7, 3))) {
    scale = register_buffer("scale", torch::linspace(0.5, 1.5, 3));  // replicated: rank 0's file
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(inp(x));
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto* block = blocks->ptr<BlockImpl>(i).get();
      x = runBlock ? runBlock(i, x) : block->forward(x);
    }
    return head(x) * scale;
  }
  torch::nn::Linear inp;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
  torch::Tensor scale;
  std::function<torch::Tensor(size_t, const torch::Tensor&)> runBlock;
};
TORCH_MODULE(Net);

constexpr int64_t kGlobalBatch = 12;  // divided by 1, 2, 3 and 4 ranks

std::map<std::string, std::string> parseArgs(int argc, char** argv) {
  std::map<std::string, std::string> out;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) == 0) out[key.substr(2)] = argv[i + 1];
  }
  return out;
}

int run(const std::map<std::string, std::string>& args) {
  auto arg = [&](const std::string& k, const std::string& fallback = "") {
    auto it = args.find(k);
    return it == args.end() ? fallback : it->second;
  };
  ddp::InitOptions init;
  if (const char* backend = std::getenv("DDP_TEST_BACKEND")) init.backend = ddp::parseBackend(backend).value();
  init.timeout = std::chrono::seconds(60);
  ddp::ProcessGroup group = ddp::initProcessGroup(init);
  torch::set_num_threads(1);
  const bool zero2 = arg("mode") == "zero2";  // ddp::fullyShard's ZeRO-2: parameters kept whole
  const bool full = arg("mode") == "full" || zero2;
  const int steps = std::stoi(arg("steps", "6"));
  const int saveAt = std::stoi(arg("save-at", "0"));

  torch::manual_seed(3);
  Net net(std::stoll(arg("hidden", "5")));
  std::vector<ddp::FullyShardedUnit> units;
  std::optional<ddp::DistributedDataParallel<Net>> ddpModel;
  if (full) {
    ddp::FullyShardOptions shardOptions;
    shardOptions.replicateParameters = zero2;
    for (size_t i = 0; i < net->blocks->size(); ++i) {
      units.push_back(ddp::fullyShard(*net->blocks->ptr<BlockImpl>(i), group, shardOptions));
    }
    units.push_back(ddp::fullyShard(*net, group, shardOptions));  // the root, last
    net->runBlock = [&](size_t i, const torch::Tensor& x) {
      return units[i].forward([&](const torch::Tensor& h) { return net->blocks->ptr<BlockImpl>(i)->forward(h); }, x);
    };
  } else {
    ddpModel.emplace(net, group);
  }
  auto forward = [&](const torch::Tensor& x) {
    if (!full) return (*ddpModel)(x);
    return units.back().forward([&](const torch::Tensor& h) { return net->forward(h); }, x);
  };

  const std::string kind = arg("optimizer", "adamw");
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (kind == "sgd") {
    optimizer = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  } else if (kind == "fused") {
    optimizer = std::make_unique<ddp::FusedAdamW>(net->parameters(), ddp::FusedAdamWOptions{});
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(net->parameters(),
                                                      torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  }

  ddp::CheckpointOptions options;
  options.dir = arg("dir", "unused-checkpoints");
  options.keepLast = 0;
  ddp::Checkpointer checkpointer(group, options);
  int start = 0;
  const std::string resume = arg("resume");
  if (resume == "auto") {
    if (auto position = checkpointer.resume(*net, *optimizer)) start = static_cast<int>(position->globalStep);
  } else if (!resume.empty()) {
    start = static_cast<int>(checkpointer.resumeFrom(resume, *net, *optimizer).globalStep);
  }
  if (const std::string again = arg("resave"); !again.empty()) {
    ddp::CheckpointOptions other = options;
    other.dir = again;
    const std::string path = ddp::Checkpointer(group, other).save(*net, *optimizer, {0, start, start, 0, -1});
    if (group.rank() == 0) std::printf("resaved %s\n", path.c_str());
  }

  const int world = group.size(), rank = group.rank();
  for (int step = start; step < steps; ++step) {
    torch::manual_seed(1000 + step);
    const torch::Tensor x = torch::randn({kGlobalBatch, 6});
    const torch::Tensor y = torch::randn({kGlobalBatch, 3});
    const int64_t per = kGlobalBatch / world;
    optimizer->zero_grad();
    torch::mse_loss(forward(x.narrow(0, rank * per, per)), y.narrow(0, rank * per, per)).backward();
    optimizer->step();
    if (step + 1 == saveAt) {
      const std::string path = checkpointer.save(*net, *optimizer, {0, step + 1, step + 1, 0, -1});
      if (rank == 0) std::printf("saved %s\n", path.c_str());
    }
  }
  if (const std::string out = arg("out"); !out.empty()) {
    const ddp::StateDict state = full ? ddp::fullStateDict(*net) : ddp::stateDict(*net);
    if (rank == 0) ddp::saveStateDict(state, out);
  }
  group.destroy();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parseArgs(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
