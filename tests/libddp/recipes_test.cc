// The training recipes of the public library against PyTorch itself (tests/python/recipes_reference.py,
// the pinned wheel): ddp::LrSchedule's lr at every step equals what PyTorch's schedulers
// (LinearLR warm-up, then ConstantLR / StepLR / CosineAnnealingLR / LinearLR, chained by
// SequentialLR) leave in the optimizer, and ddp::clipGradNorm equals clip_grad_norm_.
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

nlohmann::json askPython(const nlohmann::json& request) {
  std::string in = "/tmp/ddp_recipes_XXXXXX";
  const int fd = ::mkstemp(in.data());
  if (fd < 0) {
    ADD_FAILURE() << "mkstemp failed";
    return {};
  }
  const std::string text = request.dump();
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!written) ADD_FAILURE() << "could not write the request to " << in;
  const std::string cmd = std::string(DDP_PYTHON) + " " + DDP_SOURCE_DIR + "/tests/python/recipes_reference.py < " + in;
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (pipe != nullptr && std::fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
  const int status = pipe != nullptr ? ::pclose(pipe) : -1;
  std::remove(in.c_str());
  if (status != 0) ADD_FAILURE() << "the reference failed (" << status << "): " << out;
  return nlohmann::json::parse(out.empty() ? "{}" : out);
}

ddp::LrScheduleOptions schedule(const std::string& kind, double base, int64_t warmup, int64_t total, double minLr = 0,
                                int64_t stepSize = 1, double gamma = 0.1) {
  ddp::LrScheduleOptions o;
  o.kind = kind;
  o.baseLr = base;
  o.warmupSteps = warmup;
  o.totalSteps = total;
  o.minLr = minLr;
  o.stepSize = stepSize;
  o.gamma = gamma;
  return o;
}

TEST(LrSchedule, EveryStepEqualsPyTorchsSchedulers) {
  const std::vector<ddp::LrScheduleOptions> cases = {
      schedule("constant", 0.05, 0, 20),         schedule("constant", 0.05, 5, 20),
      schedule("step", 0.1, 0, 40, 0, 7, 0.5),   schedule("step", 0.1, 4, 40, 0, 5, 0.3),
      schedule("cosine", 3e-4, 0, 50, 1e-6),     schedule("cosine", 0.1, 10, 60, 0.0),
      schedule("cosine", 1.0, 1, 2, 0.25),       schedule("linear", 0.02, 0, 30, 0.001),
      schedule("linear", 0.02, 6, 31, 0.0)};
  nlohmann::json request = {{"schedules", nlohmann::json::array()}};
  for (const auto& o : cases) {
    request["schedules"].push_back({{"kind", o.kind}, {"base_lr", o.baseLr}, {"warmup_steps", o.warmupSteps},
                                    {"total_steps", o.totalSteps}, {"min_lr", o.minLr}, {"step_size", o.stepSize},
                                    {"gamma", o.gamma}, {"steps", o.totalSteps + 1}});
  }
  const nlohmann::json reply = askPython(request);
  ASSERT_EQ(reply["schedules"].size(), cases.size());
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const ddp::LrSchedule s(cases[c]);
    const auto& lrs = reply["schedules"][c];
    ASSERT_EQ(lrs.size(), static_cast<std::size_t>(cases[c].totalSteps + 1));
    for (std::size_t k = 0; k < lrs.size(); ++k) {
      const double want = lrs[k].get<double>();
      EXPECT_NEAR(s.at(static_cast<int64_t>(k)), want, 1e-12 * std::max(1.0, std::abs(want)))
          << cases[c].kind << " warm-up " << cases[c].warmupSteps << " step " << k;
    }
  }
}

TEST(LrSchedule, ApplySetsEveryParameterGroup) {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD sgd({torch::optim::OptimizerParamGroup({a}), torch::optim::OptimizerParamGroup({b})},
                        torch::optim::SGDOptions(0.5));
  const ddp::LrSchedule s(schedule("step", 0.5, 0, 10, 0, 2, 0.5));
  EXPECT_DOUBLE_EQ(s.apply(sgd, 5), 0.125);  // 0.5 · 0.5^floor(5/2)
  for (auto& group : sgd.param_groups()) EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.125);
}

TEST(LrSchedule, RefusesWhatPyTorchWouldNotDo) {
  EXPECT_THROW(ddp::LrSchedule(schedule("cosin", 0.1, 0, 10)), ddp::ConfigError);
  EXPECT_THROW(ddp::LrSchedule(schedule("cosine", 0.1, 10, 10)), ddp::ConfigError);  // warm-up takes the run
  EXPECT_THROW(ddp::LrSchedule(schedule("step", 0.1, 0, 10, 0, 0)), ddp::ConfigError);
  EXPECT_THROW(ddp::LrSchedule(schedule("constant", -0.1, 0, 10)), ddp::ConfigError);
  EXPECT_THROW(ddp::LrSchedule(schedule("constant", 0.1, -1, 10)), ddp::ConfigError);
}

TEST(ClipGradNorm, EqualsClipGradNormOfPyTorch) {
  torch::manual_seed(3);
  struct Case {
    std::vector<torch::Tensor> grads;
    double maxNorm;
  };
  std::vector<Case> cases = {
      {{torch::randn({4, 5}), torch::randn({5}), torch::randn({3, 2, 2})}, 1.0},  // clipped
      {{torch::randn({4, 5}) * 1e-3, torch::randn({7}) * 1e-3}, 10.0},           // within bounds
      {{torch::tensor({3.0f, 4.0f}), torch::tensor({12.0f})}, 13.0}};            // exactly at the bound
  nlohmann::json request = {{"clip", nlohmann::json::array()}};
  for (const auto& c : cases) {
    nlohmann::json grads = nlohmann::json::array(), shapes = nlohmann::json::array();
    for (const auto& g : c.grads) {
      const auto flat = g.flatten().contiguous();
      grads.push_back(std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel()));
      shapes.push_back(g.sizes().vec());
    }
    request["clip"].push_back({{"grads", grads}, {"shapes", shapes}, {"max_norm", c.maxNorm}});
  }
  const nlohmann::json reply = askPython(request);
  ASSERT_EQ(reply["clip"].size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::vector<torch::Tensor> params;
    for (const auto& g : cases[i].grads) {
      auto p = torch::zeros_like(g).requires_grad_();
      p.mutable_grad() = g.clone();
      params.push_back(p);
    }
    params.push_back(torch::zeros({2}, torch::requires_grad()));  // no gradient: skipped, as in PyTorch
    const double norm = ddp::clipGradNorm(params, cases[i].maxNorm).item<double>();
    EXPECT_EQ(static_cast<float>(norm), reply["clip"][i]["norm"].get<float>()) << "case " << i;
    for (std::size_t g = 0; g < cases[i].grads.size(); ++g) {
      const auto want = reply["clip"][i]["grads"][g].get<std::vector<float>>();
      const auto got = params[g].grad().flatten().contiguous();
      ASSERT_EQ(static_cast<std::size_t>(got.numel()), want.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(got.data_ptr<float>()[k], want[k]) << "case " << i << " gradient " << g << " element " << k;
      }
    }
    EXPECT_FALSE(params.back().grad().defined());
  }
  EXPECT_THROW(ddp::clipGradNorm({}, 0.0), ddp::ConfigError);
  EXPECT_EQ(ddp::clipGradNorm({torch::zeros({1}, torch::requires_grad())}, 1.0).item<double>(), 0.0);  // no gradients
}

}  // namespace
