// Issue 44 (6): what each rank holds with DDP, ZeRO-1, ZeRO-2 and fully sharded training, on one
// model, run under ddp-launch: parameters, gradients and AdamW's state (bytes of this rank's
// tensors; zero2: each unit's whole parameters kept in its full buffer, the shards its rows), the
// resident memory the training adds (the largest RSS sampled after each forward, backward and
// optimizer step, less the RSS before the model was made: DDP's buckets and the gathered units
// included), the peak RSS growth (getrusage: with the model's full construction, which every mode
// pays once, as FSDP2 without a meta device) and the step time. Rank 0 prints one JSON line
// with the largest value over the ranks; bench/fsdp/fsdp2_memory.py is the same in PyTorch.
//
//   ddp-launch --nproc_per_node=N fsdp_memory_bench --mode ddp|zero1|zero2|full [--width 768]
//              [--blocks 8] [--batch 16] [--steps 6]
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/fsdp/mlp_stack.h"

namespace {

// Resident now (/proc/self/statm), sampled around the steps.
double rssNowBytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

double peakRssBytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

using fsdp_bench::Block;
using fsdp_bench::Stack;

double bytesOf(const std::vector<at::Tensor>& tensors, bool grads) {
  double total = 0;
  for (const auto& p : tensors) {
    const at::Tensor& t = grads ? p.grad() : p;
    if (t.defined()) total += static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "ddp";
  int64_t width = 768, blocks = 8, batch = 16, steps = 6;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mode") mode = argv[i + 1];
    else if (a == "--width") width = std::atol(argv[i + 1]);
    else if (a == "--blocks") blocks = std::atol(argv[i + 1]);
    else if (a == "--batch") batch = std::atol(argv[i + 1]);
    else if (a == "--steps") steps = std::atol(argv[i + 1]);
  }
  if (mode != "ddp" && mode != "zero1" && mode != "zero2" && mode != "full") {
    std::fprintf(stderr, "fsdp_memory_bench: --mode is '%s'; use ddp, zero1, zero2 or full\n", mode.c_str());
    return 2;
  }
  ddp::ProcessGroup group = ddp::initProcessGroup();
  torch::manual_seed(0);
  const double rssBefore = peakRssBytes();
  const double rssStart = rssNowBytes();
  Stack model(width, blocks);
  std::unique_ptr<ddp::DistributedDataParallel<Stack>> replicated;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  const auto adamw = torch::optim::AdamWOptions(1e-4).weight_decay(0.1);
  const bool sharded = mode == "full" || mode == "zero2";
  if (sharded) {
    ddp::FullyShardOptions options;
    options.replicateParameters = mode == "zero2";
    for (auto& b : model->blocks) model->units.push_back(ddp::fullyShard(*b, group, options));
    model->units.push_back(ddp::fullyShard(*model, group, options));  // the root: the head
  } else {
    replicated = std::make_unique<ddp::DistributedDataParallel<Stack>>(model, group);
  }
  if (mode == "zero1") optimizer = std::make_unique<ddp::ZeroRedundancyOptimizer>(model->parameters(), group, adamw);
  else optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), adamw);
  double seconds = 0;
  double training = 0;  // the largest RSS sampled during the steps
  const auto sample = [&] { training = std::max(training, rssNowBytes()); };
  for (int64_t s = 0; s < steps; ++s) {
    torch::manual_seed(100 + group.rank() * 1000 + s);
    const at::Tensor x = torch::randn({batch, width});
    const auto t0 = std::chrono::steady_clock::now();
    optimizer->zero_grad();
    const at::Tensor y = sharded ? model->units.back().forward([&](const at::Tensor& h) { return model->forward(h); }, x)
                                        : replicated->forward(x);
    sample();
    y.pow(2).mean().backward();
    sample();
    optimizer->step();
    sample();
    if (s > 0) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const auto params = model->parameters();
  double total = 0;
  for (const auto& p : params) total += static_cast<double>(p.numel());
  double kept = 0;  // zero2: the whole parameters each unit keeps
  if (sharded) {  // the full count: the shards' shapes are this rank's
    total = 0;
    for (const auto& u : model->units) {
      kept += static_cast<double>(u.gatheredBytes());
      for (size_t i = 0; i < u.parameters().size(); ++i) {
        double n = 1;
        for (int64_t d : u.fullShape(i)) n *= static_cast<double>(d);
        total += n;
      }
    }
  }
  at::Tensor m = torch::tensor({mode == "zero2" ? kept : bytesOf(params, false), bytesOf(params, true),
                                static_cast<double>(ddp::optimizerStateBytes(*optimizer)),
                                training - rssStart, peakRssBytes() - rssBefore,
                                seconds / static_cast<double>(steps - 1)},
                               torch::kDouble);
  group.allReduce(m, ddp::ReduceOp::kMax);
  if (group.rank() == 0) {
    const double mb = 1024.0 * 1024.0;
    std::printf("{\"side\": \"ours\", \"mode\": \"%s\", \"world\": %d, \"parameters\": %.0f, \"param_mb\": %.1f, "
                "\"grad_mb\": %.1f, \"optim_mb\": %.1f, \"train_rss_mb\": %.1f, \"peak_rss_growth_mb\": %.1f, "
                "\"step_s\": %.4f}\n",
                mode.c_str(), group.size(), total, m[0].item<double>() / mb, m[1].item<double>() / mb,
                m[2].item<double>() / mb, m[3].item<double>() / mb, m[4].item<double>() / mb, m[5].item<double>());
  }
  group.destroy();
  return 0;
}
