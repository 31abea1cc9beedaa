// Communication hooks (ddp::CommHook, <ddp/comm_hook.h>) against PyTorch's own: 2 ranks under
// ddp-launch (DDP_TEST_BACKEND: shm or gloo) run allReduceHook, fp16/bf16CompressHook and
// PowerSgdHook on the same gradients as tests/python/comm_hook_reference.py runs allreduce_hook,
// fp16/bf16_compress_hook and powerSGD_hook over Gloo; then the hooks inside DDP: replicas stay
// equal, the warm-up steps equal plain DDP, registration misuse is refused, a static graph with
// unused parameters matches the searched one.
#include <ATen/CPUGeneratorImpl.h>
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/run_command.h"

namespace {

std::optional<ddp::ProcessGroup> theGroup;

ddp::ProcessGroup& group() { return *theGroup; }

using Shapes = std::vector<std::vector<int64_t>>;

// Two buckets: conv-like and linear matrices (two of one shape, for batching), biases.
const std::vector<Shapes> kBuckets = {{{16, 8}, {16}, {6, 4, 3, 3}, {6, 4, 3, 3}}, {{10, 12}, {10}}};

int64_t numel(const Shapes& shapes) {
  int64_t total = 0;
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    total += n;
  }
  return total;
}

struct Case {
  std::string name;
  std::string hook;
  int iterations;
  nlohmann::json powersgd;  // PowerSGDState's keyword arguments
};

std::vector<Case> cases() {
  std::vector<Case> out = {
      {"allreduce", "allreduce", 2, nullptr},
      {"fp16", "fp16", 2, nullptr},
      {"powersgd_r1", "powersgd", 6,
       {{"matrix_approximation_rank", 1}, {"start_powerSGD_iter", 2}, {"random_seed", 7}}},
      {"powersgd_r3_qr", "powersgd", 5,
       {{"matrix_approximation_rank", 3}, {"start_powerSGD_iter", 2}, {"min_compression_rate", 1}}},
      {"powersgd_batched_cold", "powersgd", 4,
       {{"matrix_approximation_rank", 2}, {"start_powerSGD_iter", 1}, {"use_error_feedback", false},
        {"warm_start", false}, {"batch_tensors_with_same_shape", true}, {"orthogonalization_epsilon", 1e-8}}},
  };
  out.push_back({"bf16", "bf16", 2, nullptr});
  return out;
}

nlohmann::json runReference() {
  nlohmann::json request;
  request["world"] = 2;
  for (const Case& c : cases()) {
    nlohmann::json j = {{"name", c.name}, {"hook", c.hook}, {"iterations", c.iterations}, {"buckets", kBuckets}};
    if (!c.powersgd.is_null()) j["powersgd"] = c.powersgd;
    request["cases"].push_back(j);
  }
  char path[] = "/tmp/comm_hook_requestXXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  ::close(fd);
  std::ofstream(path) << request.dump();
  ddp::test::CommandOptions options = ddp::test::stdoutOnly();
  options.stdinPath = path;
  const auto run = ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/comm_hook_reference.py"}, options);
  std::remove(path);
  if (run.exitCode != 0 || run.output.empty()) {
    throw std::runtime_error(std::string("the Python reference failed: comm_hook_reference.py < ") + path);
  }
  return nlohmann::json::parse(run.output);
}

const nlohmann::json& reference() {
  static const nlohmann::json ref = runReference();
  return ref;
}

std::shared_ptr<ddp::CommHook> makeHook(const Case& c) {
  if (c.hook == "allreduce") return ddp::allReduceHook();
  if (c.hook == "fp16") return ddp::fp16CompressHook();
  if (c.hook == "bf16") return ddp::bf16CompressHook();
  ddp::PowerSgdOptions o;
  const auto& p = c.powersgd;
  o.matrixApproximationRank = p.value("matrix_approximation_rank", 1);
  o.startPowerSgdIter = p.value("start_powerSGD_iter", 1000);
  o.minCompressionRate = p.value("min_compression_rate", 2.0);
  o.useErrorFeedback = p.value("use_error_feedback", true);
  o.warmStart = p.value("warm_start", true);
  o.randomSeed = p.value("random_seed", 0u);
  o.orthogonalizationEpsilon = p.value("orthogonalization_epsilon", 0.0);
  o.batchTensorsWithSameShape = p.value("batch_tensors_with_same_shape", false);
  return ddp::powerSgdHook(o);
}

class HookAgainstPyTorch : public ::testing::TestWithParam<std::string> {};

TEST_P(HookAgainstPyTorch, SameGradientsSameResult) {
  Case c;
  for (const Case& k : cases()) {
    if (k.name == GetParam()) c = k;
  }
  ASSERT_FALSE(c.name.empty()) << GetParam();
  auto hook = makeHook(c);
#if TORCH_VERSION_MAJOR < 2
  if (c.hook == "bf16" && group().backend() == ddp::Backend::kGloo) {
    // LibTorch 1.13's Gloo cannot sum bfloat16: refused before any collective, the group intact.
    at::Tensor buffer = at::ones({4});
    ddp::GradBucket bucket(0, true, buffer, {buffer}, {});
    try {
      hook->run(bucket, group()).wait();
      ADD_FAILURE() << "bf16 on LibTorch 1.13's Gloo was accepted";
    } catch (const ddp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("use fp16CompressHook"), std::string::npos) << e.what();
    }
    return;
  }
#endif
  const nlohmann::json& ref = reference().at(c.name).at(group().rank());
  const int rank = group().rank();
  size_t k = 0;
  for (int t = 0; t < c.iterations; ++t) {
    for (size_t b = 0; b < kBuckets.size(); ++b, ++k) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(1000 * t + 10 * rank + static_cast<int>(b)));
      at::Tensor buffer = at::randn({numel(kBuckets[b])}, gen);
      std::vector<at::Tensor> grads;
      int64_t offset = 0;
      for (const auto& shape : kBuckets[b]) {
        const int64_t n = numel({shape});
        grads.push_back(buffer.narrow(0, offset, n).view(shape));
        offset += n;
      }
      ddp::GradBucket bucket(b, b + 1 == kBuckets.size(), buffer, grads, {});
      hook->run(bucket, group()).wait();
      const at::Tensor expected = torch::tensor(ref.at(k).get<std::vector<float>>());
      ASSERT_EQ(expected.numel(), buffer.numel());
      if (c.hook == "powersgd") {
        // The same operations in the same order; only threads' summation order may differ.
        const double err = (buffer - expected).abs().max().item<double>();
        EXPECT_LE(err, 1e-5 * std::max(1.0, expected.abs().max().item<double>()))
            << c.name << " iteration " << t << " bucket " << b;
      } else {
        EXPECT_TRUE(at::equal(buffer, expected)) << c.name << " iteration " << t << " bucket " << b
                                                 << ": not bit for bit (max diff "
                                                 << (buffer - expected).abs().max().item<double>() << ")";
      }
    }
  }
  if (auto* psgd = dynamic_cast<ddp::PowerSgdHook*>(hook.get())) {
    EXPECT_EQ(psgd->iteration(), c.iterations);
    EXPECT_GT(psgd->compressionStats().rate, 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Hooks, HookAgainstPyTorch,
                         ::testing::Values("allreduce", "fp16", "bf16", "powersgd_r1", "powersgd_r3_qr",
                                           "powersgd_batched_cold"));

struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, spare{nullptr};
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(20, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 5));
    spare = register_module("spare", torch::nn::Linear(5, 5));  // used on even steps only
  }
  torch::Tensor forward(const torch::Tensor& x, bool useSpare) {
    torch::Tensor y = fc2(torch::relu(fc1(x)));
    return useSpare ? spare(y) : y;
  }
};
TORCH_MODULE(Net);

// Trains a copy of one model with `options` for `steps` steps on rank-dependent data.
std::vector<torch::Tensor> train(ddp::DdpOptions options, int steps, bool useSpare = true) {
  torch::manual_seed(3);
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group(), options);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(100 * s + group().rank());
    const torch::Tensor x = torch::randn({16, 20});
    opt.zero_grad();
    model(x, useSpare).pow(2).mean().backward();
    opt.step();
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

double maxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

// Every rank holds the same values: the all-reduced difference from rank 0's copy is zero.
double spreadOverRanks(const std::vector<torch::Tensor>& params) {
  double spread = 0;
  for (const auto& p : params) {
    torch::Tensor root = p.clone();
    group().broadcast(root, 0);
    torch::Tensor diff = (p - root).abs().max().reshape({1});
    group().allReduce(diff);
    spread = std::max(spread, diff.item<double>());
  }
  return spread;
}

TEST(HooksInDdp, PowerSgdKeepsReplicasEqualAndItsWarmUpIsPlainDdp) {
  const auto plain = train({}, 2);
  ddp::DdpOptions withHook;
  ddp::PowerSgdOptions psgd;
  psgd.startPowerSgdIter = 3;
  withHook.commHook = ddp::powerSgdHook(psgd);
  const auto warmUp = train(withHook, 2);
  EXPECT_LT(maxDiff(plain, warmUp), 1e-6) << "the plain all-reduce iterations differ from DDP without a hook";
  auto hook = ddp::powerSgdHook(psgd);
  withHook.commHook = hook;
  const auto compressed = train(withHook, 6);  // iterations 3.. compress
  EXPECT_EQ(spreadOverRanks(compressed), 0.0) << "replicas drifted apart under PowerSGD";
  EXPECT_GT(hook->compressionStats().rate, 1.5);
  EXPECT_GT(maxDiff(train({}, 6), compressed), 1e-6) << "PowerSGD changed nothing: was it used?";
}

TEST(HooksInDdp, Fp16HookEqualsTheCompressionOption) {
  ddp::DdpOptions option;
  option.compression = ddp::GradientCompression::kFp16;
  ddp::DdpOptions hook;
  hook.commHook = ddp::fp16CompressHook();
  EXPECT_EQ(maxDiff(train(option, 3), train(hook, 3)), 0.0);
}

TEST(HooksInDdp, RegistrationMisuseIsRefusedWithOneLine) {
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  model.registerCommHook(ddp::allReduceHook());
  try {
    model.registerCommHook(ddp::fp16CompressHook());
    ADD_FAILURE() << "a second hook was accepted";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("a hook (allreduce) is registered already"), std::string::npos) << e.what();
  }
  ddp::DdpOptions compressed;
  compressed.compression = ddp::GradientCompression::kFp16;
  ddp::DistributedDataParallel<Net> other(Net(), group(), compressed);
  EXPECT_THROW(other.registerCommHook(ddp::allReduceHook()), ddp::ConfigError);
  ddp::DdpOptions flat;
  flat.reducer = ddp::GradientReducer::kFlat;
  flat.commHook = ddp::allReduceHook();
  EXPECT_THROW(ddp::DistributedDataParallel<Net>(Net(), group(), flat), ddp::ConfigError);
  ddp::PowerSgdOptions early;
  early.startPowerSgdIter = 1;
  EXPECT_THROW(ddp::powerSgdHook(early), ddp::ConfigError);
  ddp::DistributedDataParallel<Net> late(Net(), group());
  late(torch::randn({4, 20}), true).sum().backward();
  EXPECT_THROW(late.registerCommHook(ddp::allReduceHook()), ddp::ConfigError);
}

TEST(StaticGraph, UnusedParametersFoundOnceGiveTheSearchedResult) {
  ddp::DdpOptions searched;
  searched.findUnusedParameters = true;
  ddp::DdpOptions fixed = searched;
  fixed.staticGraph = true;
  // The spare layer is never used: found in the first backward, then taken as known.
  const auto a = train(searched, 4, /*useSpare=*/false);
  const auto b = train(fixed, 4, /*useSpare=*/false);
  EXPECT_EQ(maxDiff(a, b), 0.0);
  EXPECT_EQ(spreadOverRanks(b), 0.0);
}

// A channels_last convolution weight (train.channels_last): its bucket view keeps the weight's
// strides, as PyTorch lays bucket views out, so with gradientAsBucketView the .grad that
// AccumulateGrad makes aliases the bucket from the first step on (one storage, channels_last
// strides: no copy either way); the averaged gradient is the mean of the two ranks' gradients,
// computed here from the formula on a plain copy; PowerSGD compresses it (as a view over its
// memory order) and keeps the replicas equal.
struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));
    fc = register_module("fc", torch::nn::Linear(8 * 4 * 4, 4));
    torch::NoGradGuard noGrad;
    conv->weight.set_data(conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc(torch::relu(conv(x)).flatten(1)); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ConvNet);

torch::Tensor convInput(int rank, int step) {
  torch::manual_seed(1000 + 10 * rank + step);
  return torch::randn({4, 3, 6, 6}).contiguous(at::MemoryFormat::ChannelsLast);
}

TEST(ChannelsLast, BucketViewsKeepTheWeightsStridesAndTheGradientAliasesThem) {
  torch::manual_seed(3);
  ConvNet net;
  torch::manual_seed(3);
  ConvNet plain;  // the same initial values; the formula's model
  ASSERT_TRUE(net->conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  ASSERT_FALSE(net->conv->weight.is_contiguous());
  ddp::DdpOptions options;
  options.gradientAsBucketView = true;
  ddp::DistributedDataParallel<ConvNet> model(net, group(), options);
  for (int r = 0; r < 2; ++r) (plain(convInput(r, 0)).pow(2).mean() / 2).backward();
  model(convInput(group().rank(), 0)).pow(2).mean().backward();
  const torch::Tensor grad = net->conv->weight.grad();
  EXPECT_TRUE(grad.is_contiguous(at::MemoryFormat::ChannelsLast)) << grad.strides();
  EXPECT_EQ(grad.strides(), net->conv->weight.strides());
  EXPECT_LE((grad - plain->conv->weight.grad()).abs().max().item<double>(), 1e-6);
  // The second step accumulates into the same storage: the bucket's.
  const void* storage = grad.data_ptr();
  grad.zero_();
  net->fc->weight.grad().zero_();
  net->fc->bias.grad().zero_();
  net->conv->bias.grad().zero_();
  model(convInput(group().rank(), 1)).pow(2).mean().backward();
  EXPECT_EQ(net->conv->weight.grad().data_ptr(), storage);
  EXPECT_TRUE(net->conv->weight.grad().is_contiguous(at::MemoryFormat::ChannelsLast));
}

TEST(ChannelsLast, PowerSgdCompressesAChannelsLastWeightAndKeepsReplicasEqual) {
  torch::manual_seed(3);
  ConvNet net;
  ddp::DistributedDataParallel<ConvNet> model(net, group());
  ddp::PowerSgdOptions o;
  o.matrixApproximationRank = 1;
  o.startPowerSgdIter = 2;
  o.minCompressionRate = 1.0;
  auto hook = ddp::powerSgdHook(o);
  model.registerCommHook(hook);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    model(convInput(group().rank(), step)).pow(2).mean().backward();
    opt.step();
  }
  EXPECT_GT(hook->compressionStats().elementsBefore, hook->compressionStats().elementsAfter) << "nothing compressed";
  EXPECT_TRUE(net->conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(spreadOverRanks(net->parameters()), 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ddp::InitOptions options;
  if (const char* backend = std::getenv("DDP_TEST_BACKEND")) options.backend = ddp::parseBackend(backend).value();
  options.timeout = std::chrono::seconds(60);
  theGroup = ddp::initProcessGroup(options);
  if (theGroup->size() != 2) {
    std::fprintf(stderr, "comm_hook_test runs as 2 ranks: ddp-launch --nproc_per_node=2 %s\n", argv[0]);
    return 2;
  }
  torch::set_num_threads(1);
  const int rc = RUN_ALL_TESTS();
  theGroup->destroy();
  return rc;
}
