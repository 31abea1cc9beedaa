// The public library as a user's program sees it (api_ranks_test.cc, api_ranks_ddp_test.cc,
// api_ranks_checkpoint_test.cc: one binary, run as api_single alone and as api_ddp under
// `ddp-launch --nproc_per_node=2`): the shared group, a small model, and formulas' helpers. Every
// rank runs the tests in the same order (their collectives meet): the files' link order, with the
// group's first test first and its destroy() last.
#pragma once

#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace api_ranks {

// What InitOptions::beforeGroup saw, and the data it shared with ddp::loadOncePerHost.
struct BeforeGroup {
  int calls = 0;
  int rank = -1, size = -1, localRank = -1, localSize = -1;
  std::string device;
  int64_t timeoutMs = 0;
  int loads = 0;  // load() calls in this process
  ddp::HostCopy copy;
};
BeforeGroup& beforeGroup();

// The data a host's loading rank makes: known values, so every rank can check what it got.
torch::Tensor hostData();

// The job's group, made by the first test that asks (with a beforeGroup that records BeforeGroup).
ddp::ProcessGroup& group();

// Equal on every rank: the sum over ranks is world × it.
bool equalOnAllRanks(const torch::Tensor& t);

torch::Tensor flatParams(const torch::nn::Module& m);
// Undefined gradients as zeros.
torch::Tensor flatGrads(const torch::nn::Module& m);

struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 7));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
};
TORCH_MODULE(Net);

// The same plain model, with `source`'s weights: the reference.
Net copyOf(const Net& source);

// The rows of `x` this rank's sampler gives it (no shuffle: rank r takes r, r+W, ...).
torch::Tensor shard(const torch::Tensor& x);

// The same directory on every rank (per job: MASTER_PORT): rank 0 writes, every rank reads.
std::string scratchDir(const std::string& name);

}  // namespace api_ranks
