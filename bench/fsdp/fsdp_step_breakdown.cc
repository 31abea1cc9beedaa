// Issue 44 (6): where a `full` step's wall time goes, ours (ddp::fullyShard). Run under ddp-launch;
// bench/fsdp/fsdp2_step_breakdown.py is the same for PyTorch's FSDP2. Two parts, both on
// fsdp_memory_bench's model (MLP blocks x + fc2(gelu(fc1(x))), 4x wide, and a head), AdamW:
//   - the training step split into forward (with its all-gathers), backward (with its all-gathers
//     and reduce-scatters) and the optimizer's step, mean over the steps after the first;
//   - the parts of one block's unit at the step's sizes, each the mean of --reps calls after a
//     barrier: unshard() + reshard() (all-gather + copy-out + the full buffer's allocation), the
//     all-gather alone, the reduce-scatter alone (average, the (world, S) input FSDP2 packs), the
//     all-reduce of world x S (what shm builds both on), the copy-in (packing a full gradient into
//     a fresh (world, S) buffer), a fresh world x S buffer's allocation and first touch, and the
//     block's forward + backward unsharded (the compute).
// Rank 0 prints one JSON line (seconds; each value the largest over the ranks).
//
//   ddp-launch --nproc_per_node=2 fsdp_step_breakdown [--width 768] [--blocks 8] [--batch 16]
//              [--steps 6] [--reps 20] [--backend auto|shm|gloo]
//              [--prefetch 1|0]
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/fsdp/mlp_stack.h"

namespace {

using fsdp_bench::Block;
using fsdp_bench::Stack;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  int64_t width = 768, blocks = 8, batch = 16, steps = 6, reps = 20;
  std::string backend = "auto";
  int64_t prefetch = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--width") width = std::atol(argv[i + 1]);
    else if (a == "--blocks") blocks = std::atol(argv[i + 1]);
    else if (a == "--batch") batch = std::atol(argv[i + 1]);
    else if (a == "--steps") steps = std::atol(argv[i + 1]);
    else if (a == "--reps") reps = std::atol(argv[i + 1]);
    else if (a == "--backend") backend = argv[i + 1];
    else if (a == "--prefetch") prefetch = std::atol(argv[i + 1]);
  }
  ddp::InitOptions init;  // auto: shm on one host's CPUs
  if (backend == "gloo") init.backend = ddp::Backend::kGloo;
  else if (backend == "shm") init.backend = ddp::Backend::kShm;
  ddp::ProcessGroup group = ddp::initProcessGroup(init);
  const int world = group.size();
  torch::manual_seed(0);
  Stack model(width, blocks);
  ddp::FullyShardOptions shardOptions;  // --prefetch 0: neither FSDP1's forward nor FSDP2's backward prefetch
  shardOptions.forwardPrefetch = shardOptions.backwardPrefetch = prefetch != 0;
  for (auto& b : model->blocks) model->units.push_back(ddp::fullyShard(*b, group, shardOptions));
  model->units.push_back(ddp::fullyShard(*model, group, shardOptions));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.1));

  // The step, in three parts.
  double fwd = 0, bwd = 0, opt = 0;
  for (int64_t s = 0; s < steps; ++s) {
    torch::manual_seed(100 + group.rank() * 1000 + s);
    const at::Tensor x = torch::randn({batch, width});
    group.barrier();
    auto t0 = Clock::now();
    optimizer.zero_grad();
    const at::Tensor y = model->units.back().forward([&](const at::Tensor& h) { return model->forward(h); }, x);
    const double f = since(t0);
    t0 = Clock::now();
    y.pow(2).mean().backward();
    const double b = since(t0);
    t0 = Clock::now();
    optimizer.step();
    const double o = since(t0);
    if (s > 0) fwd += f, bwd += b, opt += o;
  }
  const double timed = static_cast<double>(steps - 1);

  // One block's unit, part by part.
  ddp::FullyShardedUnit& unit = model->units.front();
  const int64_t S = unit.shardedNumel();
  const auto mean = [&](const std::function<void()>& fn) {
    fn();  // warm-up
    group.barrier();
    const auto t0 = Clock::now();
    for (int64_t r = 0; r < reps; ++r) fn();
    return since(t0) / static_cast<double>(reps);
  };
  c10::NoGradGuard noGrad;
  const at::Tensor shard = torch::randn({S});
  const at::Tensor fullGrad = torch::randn({world * S});
  const double unshard = mean([&] {
    unit.unshard();
    unit.reshard();
  });
  const double allGather = mean([&] { (void)group.allGather(shard); });
  const double reduceScatter = mean([&] {
    const at::Tensor input = fullGrad.view({world, S}).clone();
    ddp::ReduceScatterOptions average(ddp::ReduceOp::kAvg);
    (void)group.reduceScatter(input.unbind(0), average);
  });
  at::Tensor block = torch::randn({world * S});
  const double allReduce = mean([&] { group.allReduce(block); });
  const double copyIn = mean([&] { (void)at::empty({world, S}).view({-1}).copy_(fullGrad); });
  const double allocation = mean([&] { (void)at::empty({world * S}).fill_(1.0f); });
  const double fillReused = mean([&] { block.fill_(1.0f); });
  Block plain(width);
  const double compute = mean([&] {
    c10::AutoGradMode grad(true);
    const at::Tensor in = torch::randn({batch, width}).requires_grad_();
    plain->forward(in).pow(2).mean().backward();
  });

  at::Tensor m = torch::tensor({fwd / timed, bwd / timed, opt / timed, unshard, allGather, reduceScatter, allReduce,
                                copyIn, allocation, fillReused, compute},
                               torch::kDouble);
  group.allReduce(m, ddp::ReduceOp::kMax);
  if (group.rank() == 0) {
    const char* names[] = {"forward", "backward", "optimizer", "unshard_reshard", "all_gather", "reduce_scatter",
                           "all_reduce_world_x_S", "copy_in", "alloc_first_touch", "fill_reused", "block_fwd_bwd"};
    std::printf("{\"side\": \"ours\", \"backend\": \"%s\", \"prefetch\": %d, \"world\": %d, \"shard_numel\": %lld",
                group.backend() == ddp::Backend::kGloo ? "gloo" : "shm", static_cast<int>(prefetch), world,
                static_cast<long long>(S));
    for (int i = 0; i < 11; ++i) std::printf(", \"%s\": %.5f", names[i], m[i].item<double>());
    std::printf("}\n");
  }
  group.destroy();
  return 0;
}
