// The helpers of the api_ranks tests (api_ranks_support.h).
#include "tests/libddp/api_ranks_support.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace api_ranks {

BeforeGroup& beforeGroup() {
  static BeforeGroup seen;
  return seen;
}

torch::Tensor hostData() { return torch::arange(24, torch::kFloat).reshape({4, 6}) * 0.5; }

ddp::ProcessGroup& group() {
  static ddp::ProcessGroup g = [] {
    ddp::InitOptions options;
    options.timeout = std::chrono::seconds(60);  // a rank whose test failed early must not hang the other
    options.beforeGroup = [](const ddp::GroupStart& start) {
      BeforeGroup& seen = beforeGroup();
      ++seen.calls;
      seen.rank = start.rank();
      seen.size = start.size();
      seen.localRank = start.localRank();
      seen.localSize = start.localSize();
      seen.device = start.device().str();
      seen.timeoutMs = start.timeout().count();
      seen.copy = ddp::loadOncePerHost(start, [&seen] {
        ++seen.loads;
        return ddp::HostData{{hostData(), torch::tensor({3, 1, 4}, torch::kLong)}, "rows=4"};
      });
    };
    return ddp::initProcessGroup(options);
  }();
  return g;
}

bool equalOnAllRanks(const torch::Tensor& t) {
  auto local = t.detach().to(torch::kDouble).flatten().clone();
  auto sum = local.clone();
  group().allReduce(sum);
  return torch::allclose(sum, local * group().size(), 0, 1e-12);
}

torch::Tensor flatParams(const torch::nn::Module& m) {
  std::vector<torch::Tensor> ps;
  for (const auto& p : m.parameters()) ps.push_back(p.detach().flatten());
  return torch::cat(ps);
}

torch::Tensor flatGrads(const torch::nn::Module& m) {
  std::vector<torch::Tensor> gs;
  for (const auto& p : m.parameters()) gs.push_back(p.grad().defined() ? p.grad().flatten() : torch::zeros_like(p).flatten());
  return torch::cat(gs);
}

Net copyOf(const Net& source) {
  Net copy;
  torch::NoGradGuard noGrad;
  auto dst = copy->parameters();
  auto src = source->parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  return copy;
}

torch::Tensor shard(const torch::Tensor& x) {
  ddp::DistributedSampler sampler(x.size(0), group(), {/*shuffle=*/false});
  return x.index_select(0, torch::tensor(sampler.indices(), torch::kLong));
}

std::string scratchDir(const std::string& name) {
  const char* port = std::getenv("MASTER_PORT");
  auto dir = std::filesystem::temp_directory_path() / ("ddp_api_test_" + std::string(port ? port : "solo") + "_" + name);
  return dir.string();
}

}  // namespace api_ranks
