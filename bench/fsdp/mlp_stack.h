// The model of bench/fsdp's programs (fsdp_memory_bench, fsdp_step_breakdown) and of their Python
// twins (fsdp2_memory.py, fsdp2_step_breakdown.py): MLP blocks with a residual, the shape of a
// transformer's MLP, then a head. With units, each block's forward goes through its unit.
#pragma once

#include <ddp/fully_shard.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace fsdp_bench {

// x + fc2(gelu(fc1(x))).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))) {}
  at::Tensor forward(const at::Tensor& x) { return x + fc2->forward(torch::gelu(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct StackImpl : torch::nn::Module {
  StackImpl(int64_t width, int64_t count) {
    for (int64_t i = 0; i < count; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(width)));
    head = register_module("head", torch::nn::Linear(width, width));
  }
  at::Tensor forward(at::Tensor x) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (units.empty()) {
        x = blocks[i]->forward(x);
      } else {
        x = units[i].forward([&](const at::Tensor& h) { return blocks[i]->forward(h); }, x);
      }
    }
    return head->forward(x);
  }
  std::vector<Block> blocks;
  std::vector<ddp::FullyShardedUnit> units;  // one per block once sharded
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Stack);

}  // namespace fsdp_bench
