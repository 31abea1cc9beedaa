// The training recipes of the public library against PyTorch itself (tests/python/recipes_reference.py,
// the pinned wheel): ddp::LrSchedule's lr at every step equals what PyTorch's schedulers
// (LinearLR warm-up, then ConstantLR / StepLR / CosineAnnealingLR / LinearLR, chained by
// SequentialLR) leave in the optimizer, ddp::clipGradNorm equals clip_grad_norm_, ddp::GradScaler
// gives torch.amp.GradScaler's scales, skipped steps and parameters, and ddp::Autocast computes what
// torch.autocast("cpu") does.
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/support/run_command.h"

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
  ddp::test::CommandOptions options = ddp::test::stdoutOnly();
  options.stdinPath = in;
  const auto run = ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/recipes_reference.py"}, options);
  std::remove(in.c_str());
  if (run.exitCode != 0) ADD_FAILURE() << "the reference failed (exit " << run.exitCode << "): " << run.output;
  return nlohmann::json::parse(run.output.empty() ? "{}" : run.output);
}

ddp::LrScheduleOptions schedule(const std::string& kind, double base, int64_t warmup, int64_t total, double minLr = 0,
                                int64_t stepSize = 1, double gamma = 0.1) {
  ddp::LrScheduleOptions o;
  o.kind = ddp::parseLrDecay(kind).value();
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
    request["schedules"].push_back({{"kind", ddp::lrDecayName(o.kind)}, {"base_lr", o.baseLr}, {"warmup_steps", o.warmupSteps},
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
          << ddp::lrDecayName(cases[c].kind) << " warm-up " << cases[c].warmupSteps << " step " << k;
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
  EXPECT_FALSE(ddp::parseLrDecay("cosin").has_value());  // a misspelt name never reaches the options
  ddp::LrScheduleOptions unknown = schedule("cosine", 0.1, 0, 10);
  unknown.kind = static_cast<ddp::LrDecay>(9);  // a value no LrDecay has
  EXPECT_THROW(ddp::LrSchedule{unknown}, ddp::ConfigError);
  EXPECT_THROW(ddp::LrSchedule(schedule("cosine", 0.1, 10, 10)), ddp::ConfigError);  // warm-up takes the run
  EXPECT_THROW(ddp::LrSchedule(schedule("step", 0.1, 0, 10, 0, 0)), ddp::ConfigError);
  EXPECT_THROW(ddp::LrSchedule(schedule("constant", -0.1, 0, 10)), ddp::ConfigError);
  EXPECT_THROW(ddp::LrSchedule(schedule("constant", 0.1, -1, 10)), ddp::ConfigError);
  // LinearLR's end_factor must be <= 1: a "decay" to a higher lr was taken, rising.
  EXPECT_THROW(ddp::LrSchedule(schedule("linear", 0.1, 0, 10, 0.2)), ddp::ConfigError);
  EXPECT_NO_THROW(ddp::LrSchedule(schedule("linear", 0.1, 0, 10, 0.1)));
}

// Past totalSteps a cosine rises again as CosineAnnealingLR does (checked against PyTorch above);
// holdMinLr keeps minLr there, as nanoGPT's get_lr: `if it > lr_decay_iters: return min_lr`, and
// before it coeff = 0.5 (1 + cos(pi (it - warmup) / (decay - warmup))), the warm-up
// lr (it + 1) / (warmup + 1).
TEST(LrSchedule, HoldMinLrIsNanoGptsGetLr) {
  ddp::LrScheduleOptions o = schedule("cosine", 0.1, 2, 5, 0.001);
  const ddp::LrSchedule rising(o);
  o.holdMinLr = true;
  const ddp::LrSchedule held(o);
  for (int64_t it = 0; it < 12; ++it) {
    double want = 0.001;
    if (it < 2) {
      want = 0.1 * static_cast<double>(it + 1) / 3.0;
    } else if (it <= 5) {
      want = 0.001 + 0.5 * (1.0 + std::cos(M_PI * static_cast<double>(it - 2) / 3.0)) * (0.1 - 0.001);
    }
    EXPECT_NEAR(held.at(it), want, 1e-15) << it;
    if (it <= 5) EXPECT_NEAR(rising.at(it), want, 1e-15) << it;
  }
  EXPECT_GT(rising.at(8), 0.09) << "CosineAnnealingLR is back at its top after 2 T_max";
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
    // The first parameter listed again, as LibTorch's parameters() lists a tied weight under both of
    // its names: counted and clipped once (Python's model.parameters() yields it once).
    std::vector<torch::Tensor> listed = params;
    listed.push_back(params.front());
    const double norm = ddp::clipGradNorm(listed, cases[i].maxNorm).item<double>();
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

// One GradScaler run: SGD on loss = sum(p * g), some g made non-finite; growth_interval small enough
// to grow within the run, and a scale near the float limit so that a growth would overflow.
struct ScalerCase {
  ddp::GradScalerOptions options;
  double lr;
  std::vector<std::pair<std::string, int>> bad;  // per step: "none" | "inf" | "-inf" | "nan", and where
};

TEST(GradScaler, ScalesAndSkippedStepsEqualTorchAmpGradScaler) {
  torch::manual_seed(11);
  const int64_t n = 6;
  std::vector<ScalerCase> cases;
  {
    ScalerCase c{{65536.0, 2.0, 0.5, 3, true}, 0.1, {}};
    const char* pattern[] = {"none", "inf", "none", "none", "none", "none", "nan", "-inf", "none",
                             "none", "none", "none", "none", "none", "inf", "none", "none", "none"};
    for (int i = 0; i < 18; ++i) c.bad.emplace_back(pattern[i], i % n);
    cases.push_back(c);
  }
  {
    // 2^126 · 2 = 2^127 is finite, 2^127 · 2 is not: that growth is refused (the kernel's isfinite).
    ScalerCase c{{std::ldexp(1.0, 126), 2.0, 0.25, 2, true}, 0.01, {}};
    for (int i = 0; i < 9; ++i) c.bad.emplace_back(i == 6 ? "inf" : "none", 2);
    cases.push_back(c);
  }
  std::vector<torch::Tensor> initial;
  std::vector<std::vector<torch::Tensor>> gradients;
  nlohmann::json request = {{"scaler", nlohmann::json::array()}};
  for (const auto& c : cases) {
    initial.push_back(torch::randn({n}));
    nlohmann::json steps = nlohmann::json::array();
    gradients.emplace_back();
    for (const auto& [bad, at] : c.bad) {
      const auto g = torch::randn({n}) + 3.0;  // no zero: every taken step moves every parameter
      gradients.back().push_back(g);
      steps.push_back({{"g", std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + n)}, {"bad", bad}, {"at", at}});
    }
    const auto& p = initial.back();
    request["scaler"].push_back({{"init_scale", c.options.initScale}, {"growth_factor", c.options.growthFactor},
                                 {"backoff_factor", c.options.backoffFactor},
                                 {"growth_interval", c.options.growthInterval}, {"lr", c.lr},
                                 {"params", std::vector<float>(p.data_ptr<float>(), p.data_ptr<float>() + n)},
                                 {"steps", steps}});
  }
  const nlohmann::json reply = askPython(request);
  ASSERT_EQ(reply["scaler"].size(), cases.size());
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const auto& want = reply["scaler"][c];
    auto p = initial[c].clone().requires_grad_();
    torch::optim::SGD sgd({p}, torch::optim::SGDOptions(cases[c].lr));
    ddp::GradScaler scaler(cases[c].options);
    for (std::size_t i = 0; i < cases[c].bad.size(); ++i) {
      auto g = gradients[c][i].clone();
      const auto& [bad, at] = cases[c].bad[i];
      if (bad != "none") g[at] = bad == "nan" ? NAN : (bad == "inf" ? INFINITY : -INFINITY);
      sgd.zero_grad();
      scaler.scale((p * g).sum()).backward();
      scaler.step(sgd);
      scaler.update();
      const bool stepped = scaler.foundInf().item<float>() == 0.0f;
      EXPECT_EQ(stepped, want["stepped"][i].get<bool>()) << "case " << c << " step " << i;
      EXPECT_EQ(scaler.getScale(), want["scales"][i].get<double>()) << "case " << c << " step " << i;
      EXPECT_EQ(scaler.stateDict()->growthTracker, want["trackers"][i].get<int64_t>()) << "case " << c << " step " << i;
    }
    const auto params = want["params"].get<std::vector<float>>();
    for (int64_t k = 0; k < n; ++k) EXPECT_EQ(p[k].item<float>(), params[k]) << "case " << c << " parameter " << k;
  }
}

TEST(GradScaler, MisuseIsAnErrorAsInPyTorch) {
  auto p = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  ddp::GradScaler scaler;
  EXPECT_THROW(scaler.unscale_(sgd), ddp::Error);  // before scale()
  scaler.scale(p.sum()).backward();
  scaler.unscale_(sgd);
  EXPECT_THROW(scaler.unscale_(sgd), ddp::Error);  // twice before update()
  scaler.step(sgd);
  EXPECT_EQ(scaler.foundInf().item<float>(), 0.0f);
  EXPECT_THROW(scaler.step(sgd), ddp::Error);  // twice before update()
  EXPECT_THROW(scaler.unscale_(sgd), ddp::Error);  // after step()
  scaler.update();
  EXPECT_EQ(p.grad()[0].item<float>(), 1.0f);  // unscaled once: 65536 · 1 / 65536
  // A step with no gradient at all (no backward): PyTorch's "No inf checks were recorded".
  auto q = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD idle({q}, torch::optim::SGDOptions(0.1));
  (void)scaler.scale(q.sum());
  try {
    scaler.step(idle);
    ADD_FAILURE() << "a step without gradients was taken";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no inf checks were recorded for this optimizer"), std::string::npos) << e.what();
  }
  // ... and update() after it: "No inf checks were recorded prior to update." (it counted a finite
  // step: the growth tracker moved).
  try {
    scaler.update();
    ADD_FAILURE() << "an update without an inf check was taken";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no inf checks were recorded"), std::string::npos) << e.what();
  }
  EXPECT_EQ(scaler.stateDict()->growthTracker, 1) << "the one finite step before";
  EXPECT_THROW(ddp::GradScaler({65536.0, 1.0}), ddp::ConfigError);        // growth must be > 1
  EXPECT_THROW(ddp::GradScaler({65536.0, 2.0, 1.5}), ddp::ConfigError);   // backoff must be < 1
  EXPECT_THROW(ddp::GradScaler({65536.0, 2.0, 0.5, 0}), ddp::ConfigError);
  // Disabled: the identity, a plain step, no state.
  ddp::GradScaler off({65536.0, 2.0, 0.5, 2000, false});
  EXPECT_TRUE(torch::equal(off.scale(torch::ones({2})), torch::ones({2})));
  EXPECT_EQ(off.getScale(), 1.0);
  EXPECT_FALSE(off.stateDict().has_value());
  // A state loaded before the first scale() is where the scale starts (load_state_dict).
  ddp::GradScaler loaded;
  loaded.loadStateDict({1024.0, 2.0, 0.5, 2000, 7});
  EXPECT_EQ(loaded.scale(torch::ones({})).item<float>(), 1024.0f);
  EXPECT_EQ(loaded.stateDict()->growthTracker, 7);
}

TEST(Autocast, ComputesWhatTorchAutocastComputes) {
  torch::manual_seed(5);
  const auto x = torch::randn({4, 8}), w = torch::randn({3, 8}), b = torch::randn({3});
  std::vector<std::string> dtypes = {"bf16"};
  if (ddp::Autocast::supports(torch::kCPU, torch::kHalf)) dtypes.push_back("fp16");
  nlohmann::json request = {{"autocast", nlohmann::json::array()}};
  auto flat = [](const torch::Tensor& t) {
    const auto c = t.flatten().contiguous();
    return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  };
  for (const auto& d : dtypes) {
    request["autocast"].push_back({{"x", flat(x)}, {"x_shape", x.sizes().vec()}, {"w", flat(w)},
                                   {"w_shape", w.sizes().vec()}, {"b", flat(b)}, {"dtype", d}});
  }
  const nlohmann::json reply = askPython(request);
  ASSERT_EQ(reply["autocast"].size(), dtypes.size());
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    const auto dtype = dtypes[i] == "bf16" ? torch::kBFloat16 : torch::kHalf;
    torch::Tensor y, loss;
    {
      ddp::Autocast autocast(torch::kCPU, dtype);
      y = torch::nn::functional::linear(x, w, b);
      loss = torch::nn::functional::cross_entropy(y, torch::zeros({4}, torch::kLong));
      {
        ddp::Autocast off(torch::kCPU, dtype, /*enabled=*/false);  // nested: fp32 inside, restored after
        EXPECT_EQ(torch::mm(x, w.t()).scalar_type(), torch::kFloat);
      }
      EXPECT_EQ(torch::mm(x, w.t()).scalar_type(), dtype);
    }
    EXPECT_EQ(torch::mm(x, w.t()).scalar_type(), torch::kFloat);  // restored
    const auto& want = reply["autocast"][i];
    EXPECT_EQ(want["dtype"].get<std::string>(), dtypes[i] == "bf16" ? "bfloat16" : "float16");
    EXPECT_EQ(y.scalar_type(), dtype);
    EXPECT_EQ(want["loss_dtype"].get<std::string>(), "float32");  // cross_entropy runs in fp32 under autocast
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
    const auto ys = want["y"].get<std::vector<float>>();
    const auto got = flat(y.to(torch::kFloat));
    ASSERT_EQ(got.size(), ys.size());
    // The same LibTorch as the reference computes the same bits; 1.13 (Debian) may round differently.
    const double tolerance = TORCH_VERSION_MAJOR >= 2 ? 0.0 : 1e-2;
    for (std::size_t k = 0; k < ys.size(); ++k) {
      EXPECT_NEAR(got[k], ys[k], tolerance * std::max(1.0f, std::abs(ys[k]))) << dtypes[i] << " element " << k;
    }
    EXPECT_NEAR(loss.item<double>(), want["loss"].get<double>(), TORCH_VERSION_MAJOR >= 2 ? 0.0 : 1e-2);
  }
  EXPECT_THROW(ddp::Autocast(torch::kCPU, torch::kDouble), ddp::ConfigError);
}

// torch.autocast("cuda") in a process without CUDA warns ("User provided device_type of 'cuda', but
// CUDA is not available. Disabling") and does nothing; ddp::Autocast says so once, not per step.
TEST(Autocast, CudaWithoutACudaDeviceWarnsOnceAndDoesNothing) {
  if (ddp::cudaDeviceCount() > 0) GTEST_SKIP() << "this process sees a CUDA device";
  const auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  spdlog::default_logger()->sinks().push_back(sink);
  const auto x = torch::randn({4, 8}), w = torch::randn({3, 8});
  for (int step = 0; step < 3; ++step) {
    ddp::Autocast autocast(torch::kCUDA, torch::kBFloat16);
    EXPECT_EQ(torch::mm(x, w.t()).scalar_type(), torch::kFloat);
  }
  spdlog::default_logger()->sinks().pop_back();
  int warnings = 0;
  for (const std::string& line : sink->last_formatted()) {
    warnings += line.find("ddp::Autocast(kCUDA, ...): this process sees no CUDA device, so it does nothing") !=
                std::string::npos;
  }
  EXPECT_EQ(warnings, 1);
}

// ddp::FusedAdamW under a GradScaler equals torch.optim.AdamW(fused=True) (and Adam) under
// torch.amp.GradScaler on the CPU, step by step: parameters, scale and the step count (a skipped
// step is undone on the device), with and without unscale_() before step().
TEST(FusedAdamW, EqualsTorchAdamWFusedUnderGradScaler) {
  if (!ddp::FusedAdamW::available(torch::kCPU)) {
    // LibTorch 1.13 has no fused AdamW kernel: the class says so in one line.
    auto p = torch::zeros({2}, torch::requires_grad());
    EXPECT_THROW(ddp::FusedAdamW({p}), ddp::ConfigError);
    return;
  }
  torch::manual_seed(21);
  const int64_t n = 5;
  struct Case {
    bool decoupled, amsgrad;
    double weightDecay;
  };
  const std::vector<Case> cases = {{true, false, 0.05}, {false, false, 0.01}, {true, true, 0.0}};
  const char* bad[] = {"none", "none", "inf", "none", "nan", "none", "none", "none", "-inf", "none", "none", "none"};
  std::vector<torch::Tensor> initial;
  std::vector<torch::Tensor> grads;
  for (std::size_t i = 0; i < std::size(bad); ++i) grads.push_back(torch::randn({n}) + 2.0);
  nlohmann::json request = {{"fused", nlohmann::json::array()}};
  for (const auto& c : cases) {
    initial.push_back(torch::randn({n}));
    nlohmann::json steps = nlohmann::json::array();
    for (std::size_t i = 0; i < std::size(bad); ++i) {
      const auto& g = grads[i];
      steps.push_back({{"g", std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + n)},
                       {"bad", bad[i]}, {"at", static_cast<int>(i % n)}, {"unscale", i % 3 == 1}});
    }
    const auto& p = initial.back();
    request["fused"].push_back({{"decoupled", c.decoupled}, {"lr", 0.01}, {"betas", {0.9, 0.99}}, {"eps", 1e-8},
                                {"weight_decay", c.weightDecay}, {"amsgrad", c.amsgrad}, {"init_scale", 256.0},
                                {"growth_interval", 3},
                                {"params", std::vector<float>(p.data_ptr<float>(), p.data_ptr<float>() + n)},
                                {"steps", steps}});
  }
  const nlohmann::json reply = askPython(request);
  ASSERT_EQ(reply["fused"].size(), cases.size());
  for (std::size_t c = 0; c < cases.size(); ++c) {
    auto p = initial[c].clone().requires_grad_();
    ddp::FusedAdamWOptions o;
    o.lr = 0.01;
    o.beta2 = 0.99;
    o.weightDecay = cases[c].weightDecay;
    o.amsgrad = cases[c].amsgrad;
    o.decoupledWeightDecay = cases[c].decoupled;
    ddp::FusedAdamW adam({p}, o);
    ddp::GradScaler scaler({256.0, 2.0, 0.5, 3});
    const auto& want = reply["fused"][c];
    for (std::size_t i = 0; i < std::size(bad); ++i) {
      auto g = grads[i].clone();
      const std::string b = bad[i];
      if (b != "none") g[static_cast<int64_t>(i % n)] = b == "nan" ? NAN : (b == "inf" ? INFINITY : -INFINITY);
      adam.zero_grad();
      scaler.scale((p * g).sum()).backward();
      if (i % 3 == 1) scaler.unscale_(adam);
      scaler.step(adam);
      scaler.update();
      const auto params = want["params"][i].get<std::vector<float>>();
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(p[k].item<float>(), params[k]) << "case " << c << " step " << i << " parameter " << k;
      }
      EXPECT_EQ(scaler.getScale(), want["scales"][i].get<double>()) << "case " << c << " step " << i;
      const auto* st = adam.stateOf(p);
      ASSERT_NE(st, nullptr);
      EXPECT_EQ(st->step.item<float>(), want["steps"][i].get<float>()) << "case " << c << " step " << i;
    }
  }
}

// ddp::fusedSgdStep (what train.cuda_graph steps SGD with) equals torch.optim.SGD(fused=True) with a
// tensor learning rate changed between steps and GradScaler-style found_inf skips, on the CPU
// kernel of the same LibTorch, to the bit: plain, momentum with dampening and weight decay, Nesterov.
TEST(FusedSgd, EqualsTorchSgdFusedWithATensorLearningRate) {
  if (!ddp::fusedSgdAvailable()) {
    torch::optim::SGD sgd({torch::zeros({2}, torch::requires_grad())}, 0.1);
    EXPECT_THROW(ddp::fusedSgdStep(sgd, torch::tensor(0.1)), ddp::ConfigError);
    return;
  }
  torch::manual_seed(22);
  const int64_t n = 6;
  struct Case {
    double momentum, dampening, weightDecay;
    bool nesterov;
  };
  const std::vector<Case> cases = {{0.0, 0.0, 0.0, false}, {0.9, 0.1, 0.01, false}, {0.9, 0.0, 0.001, true}};
  const std::vector<double> lrs = {0.1, 0.05, 0.05, 0.02, 0.2, 0.01, 0.1};
  const std::vector<bool> skip = {false, false, true, false, false, true, false};
  std::vector<torch::Tensor> grads;
  for (std::size_t i = 0; i < lrs.size(); ++i) grads.push_back(torch::randn({n}));
  std::vector<torch::Tensor> initial;
  nlohmann::json request = {{"fused_sgd", nlohmann::json::array()}};
  for (const auto& c : cases) {
    initial.push_back(torch::randn({n}));
    nlohmann::json steps = nlohmann::json::array();
    for (std::size_t i = 0; i < lrs.size(); ++i) {
      steps.push_back({{"g", std::vector<float>(grads[i].data_ptr<float>(), grads[i].data_ptr<float>() + n)},
                       {"lr", lrs[i]}, {"skip", static_cast<bool>(skip[i])}});
    }
    const auto& p = initial.back();
    request["fused_sgd"].push_back({{"momentum", c.momentum}, {"dampening", c.dampening},
                                    {"weight_decay", c.weightDecay}, {"nesterov", c.nesterov}, {"lrs", lrs},
                                    {"params", std::vector<float>(p.data_ptr<float>(), p.data_ptr<float>() + n)},
                                    {"steps", steps}});
  }
  const nlohmann::json reply = askPython(request);
  ASSERT_EQ(reply["fused_sgd"].size(), cases.size());
  for (std::size_t c = 0; c < cases.size(); ++c) {
    auto p = initial[c].clone().requires_grad_();
    torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1)
                                   .momentum(cases[c].momentum)
                                   .dampening(cases[c].dampening)
                                   .weight_decay(cases[c].weightDecay)
                                   .nesterov(cases[c].nesterov));
    const auto lr = torch::zeros({});
    for (std::size_t i = 0; i < lrs.size(); ++i) {
      lr.fill_(lrs[i]);
      p.mutable_grad() = grads[i].clone();
      ddp::fusedSgdStep(sgd, lr, torch::full({}, skip[i] ? 1.0 : 0.0));
      const auto want = reply["fused_sgd"][c]["params"][i].get<std::vector<float>>();
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(p[k].item<float>(), want[k]) << "case " << c << " step " << i << " parameter " << k;
      }
    }
    if (cases[c].momentum != 0) {  // the buffer sits where LibTorch's SGD (and the Checkpointer) keeps it
      const auto& state = sgd.state();
      ASSERT_EQ(state.size(), 1u);
    }
  }
}

// Fused optimizers take float16 parameters under a GradScaler, as PyTorch's do (_check_inf_per_device
// with allow_fp16): w = [1, 2] fp16, loss sum(w.float()^2), scale 256, lr 0.1; the weights PyTorch
// 2.x gives (torch.optim.AdamW / SGD(fused=True), torch.amp.GradScaler("cpu", init_scale=256)).
// unscale_() still refuses float16 gradients. (Both fused steps threw "attempting to unscale".)
TEST(FusedOptimizers, TakeFloat16ParametersUnderGradScaler) {
  if (!ddp::FusedAdamW::available(torch::kCPU) || !ddp::FusedSGD::available(torch::kCPU)) {
    // LibTorch 1.13 has no fused kernels: the classes say so in one line.
    auto p = torch::zeros({2}, torch::requires_grad());
    EXPECT_THROW(ddp::FusedAdamW({p}), ddp::ConfigError);
    EXPECT_THROW(ddp::FusedSGD({p}, torch::optim::SGDOptions(0.1)), ddp::ConfigError);
    return;
  }
  const auto run = [](bool adamw) {
    auto w = torch::tensor({1.0, 2.0}, torch::kHalf).requires_grad_();
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (adamw) {
      ddp::FusedAdamWOptions o;
      o.lr = 0.1;
      optimizer = std::make_unique<ddp::FusedAdamW>(std::vector<at::Tensor>{w}, o);
    } else {
      optimizer = std::make_unique<ddp::FusedSGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(0.1));
    }
    ddp::GradScaler scaler({256.0});
    scaler.scale((w.to(torch::kFloat) * w.to(torch::kFloat)).sum()).backward();
    scaler.step(*optimizer);
    scaler.update();
    EXPECT_EQ(scaler.getScale(), 256.0);
    return std::vector<float>{w[0].item<float>(), w[1].item<float>()};
  };
  EXPECT_EQ(run(true), (std::vector<float>{0.89892578125f, 1.8984375f}));
  EXPECT_EQ(run(false), (std::vector<float>{0.7998046875f, 1.599609375f}));
  auto w = torch::tensor({1.0, 2.0}, torch::kHalf).requires_grad_();
  ddp::FusedSGD sgd({w}, torch::optim::SGDOptions(0.1));
  ddp::GradScaler scaler({256.0});
  scaler.scale((w.to(torch::kFloat) * w.to(torch::kFloat)).sum()).backward();
  EXPECT_THROW(scaler.unscale_(sgd), ddp::Error);  // "Attempting to unscale FP16 gradients"
  ddp::FusedAdamWOptions negative;
  negative.weightDecay = -0.1;  // torch.optim.AdamW: "Invalid weight_decay value"
  EXPECT_THROW(ddp::FusedAdamW({torch::zeros({2}, torch::requires_grad())}, negative), ddp::ConfigError);
}

// A first step whose gradients are not finite makes no momentum buffer in torch.optim.SGD (the
// scaler skips optimizer.step()), so the next step starts it as the gradient. With dampening that
// differs from a zero buffer: momentum 0.9, dampening 0.5, lr 0.1, w = [1, 2], loss sum(w^2) with
// the first step's loss infinite, 3 steps: PyTorch's SGD(fused=False) gives [0.540000021,
// 1.08000004] (FusedSGD gave 0.72, 1.44: its zero buffer made (1 - 0.5) g).
TEST(FusedSgd, ASkippedFirstStepStartsTheBufferAsSgdDoes) {
  if (!ddp::FusedSGD::available(torch::kCPU)) {
    EXPECT_THROW(ddp::FusedSGD({torch::zeros({2}, torch::requires_grad())}, torch::optim::SGDOptions(0.1)),
                 ddp::ConfigError);
    return;
  }
  auto w = torch::tensor({1.0f, 2.0f}).requires_grad_();
  ddp::FusedSGD sgd({w}, torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.5));
  ddp::GradScaler scaler;
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    scaler.scale((w * w).sum() * (step == 0 ? INFINITY : 1.0f)).backward();
    scaler.step(sgd);
    scaler.update();
    if (step == 0) EXPECT_EQ(sgd.state().size(), 0u) << "no buffer after the skipped step";
  }
  EXPECT_NEAR(w[0].item<float>(), 0.540000021f, 1e-6);
  EXPECT_NEAR(w[1].item<float>(), 1.08000004f, 1e-6);
}

// A parameter whose first gradient comes later (unused at first) starts its buffer then, while
// the others keep theirs: as LibTorch's (and Python's) SGD, momentum 0.9, 3 steps. (One kernel call
// per device and dtype took is_first_step for the whole list and restarted the others' buffers.)
TEST(FusedSgd, AParameterThatJoinsLaterLeavesTheOthersBuffers) {
  if (!ddp::FusedSGD::available(torch::kCPU)) {
    EXPECT_THROW(ddp::FusedSGD({torch::zeros({2}, torch::requires_grad())}, torch::optim::SGDOptions(0.1)),
                 ddp::ConfigError);
    return;
  }
  const auto run = [](bool fused) {
    auto a = torch::tensor({1.0f, -2.0f}).requires_grad_();
    auto b = torch::tensor({0.5f, 3.0f}).requires_grad_();
    const auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
    std::unique_ptr<torch::optim::Optimizer> sgd;
    if (fused) sgd = std::make_unique<ddp::FusedSGD>(std::vector<at::Tensor>{a, b}, options);
    else sgd = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{a, b}, options);
    for (int step = 0; step < 3; ++step) {
      sgd->zero_grad();
      at::Tensor loss = (a * a).sum();
      if (step > 0) loss = loss + (b * b * b).sum();  // b unused in the first step
      loss.backward();
      sgd->step();
    }
    return std::vector<float>{a[0].item<float>(), a[1].item<float>(), b[0].item<float>(), b[1].item<float>()};
  };
  const auto fused = run(true), plain = run(false);
  for (std::size_t k = 0; k < plain.size(); ++k) EXPECT_NEAR(fused[k], plain[k], 1e-6) << k;
}

// ddp::FusedSGD under a GradScaler equals torch.optim.SGD(fused=True) under torch.amp.GradScaler on
// the CPU, step by step and to the bit: the kernel unscales the gradients and skips an overflowed
// step itself (the scale backs off), with and without unscale_() before step(); plain, momentum with
// dampening and weight decay, Nesterov. Its momentum buffers sit where LibTorch's SGD keeps them.
TEST(FusedSgd, EqualsTorchSgdFusedUnderGradScaler) {
  if (!ddp::FusedSGD::available(torch::kCPU)) {
    auto p = torch::zeros({2}, torch::requires_grad());
    EXPECT_THROW(ddp::FusedSGD({p}, torch::optim::SGDOptions(0.1)), ddp::ConfigError);
    return;
  }
  torch::manual_seed(23);
  const int64_t n = 5;
  struct Case {
    double momentum, dampening, weightDecay;
    bool nesterov;
  };
  const std::vector<Case> cases = {{0.0, 0.0, 0.0, false}, {0.9, 0.1, 0.01, false}, {0.9, 0.0, 0.001, true}};
  const char* bad[] = {"none", "none", "inf", "none", "nan", "none", "none", "none", "-inf", "none", "none", "none"};
  std::vector<torch::Tensor> initial;
  std::vector<torch::Tensor> grads;
  for (std::size_t i = 0; i < std::size(bad); ++i) grads.push_back(torch::randn({n}) + 1.0);
  nlohmann::json request = {{"fused_sgd_scaler", nlohmann::json::array()}};
  for (const auto& c : cases) {
    initial.push_back(torch::randn({n}));
    nlohmann::json steps = nlohmann::json::array();
    for (std::size_t i = 0; i < std::size(bad); ++i) {
      const auto& g = grads[i];
      steps.push_back({{"g", std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + n)},
                       {"bad", bad[i]}, {"at", static_cast<int>(i % n)}, {"unscale", i % 3 == 1}});
    }
    const auto& p = initial.back();
    request["fused_sgd_scaler"].push_back(
        {{"lr", 0.05}, {"momentum", c.momentum}, {"dampening", c.dampening}, {"weight_decay", c.weightDecay},
         {"nesterov", c.nesterov}, {"init_scale", 256.0}, {"growth_interval", 3},
         {"params", std::vector<float>(p.data_ptr<float>(), p.data_ptr<float>() + n)}, {"steps", steps}});
  }
  const nlohmann::json reply = askPython(request);
  ASSERT_EQ(reply["fused_sgd_scaler"].size(), cases.size());
  for (std::size_t c = 0; c < cases.size(); ++c) {
    auto p = initial[c].clone().requires_grad_();
    ddp::FusedSGD sgd({p}, torch::optim::SGDOptions(0.05)
                               .momentum(cases[c].momentum)
                               .dampening(cases[c].dampening)
                               .weight_decay(cases[c].weightDecay)
                               .nesterov(cases[c].nesterov));
    ddp::GradScaler scaler({256.0, 2.0, 0.5, 3});
    const auto& want = reply["fused_sgd_scaler"][c];
    for (std::size_t i = 0; i < std::size(bad); ++i) {
      auto g = grads[i].clone();
      const std::string b = bad[i];
      if (b != "none") g[static_cast<int64_t>(i % n)] = b == "nan" ? NAN : (b == "inf" ? INFINITY : -INFINITY);
      sgd.zero_grad();
      scaler.scale((p * g).sum()).backward();
      if (i % 3 == 1) scaler.unscale_(sgd);
      scaler.step(sgd);
      scaler.update();
      const auto params = want["params"][i].get<std::vector<float>>();
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(p[k].item<float>(), params[k]) << "case " << c << " step " << i << " parameter " << k;
      }
      EXPECT_EQ(scaler.getScale(), want["scales"][i].get<double>()) << "case " << c << " step " << i;
    }
    // An SGD to the rest of LibTorch: the buffer is in SGD's state, under the parameter's key.
    EXPECT_NE(dynamic_cast<torch::optim::SGD*>(&sgd), nullptr);
    EXPECT_EQ(sgd.state().size(), cases[c].momentum != 0 ? 1u : 0u) << "case " << c;
  }
}

// ddp::NonFiniteSteps: one flag per checked step, read at once. Which steps are flagged, the first
// one's number and the run of flagged steps at the end (carried across reads) follow from where the
// NaNs and infinities were put; more than one chunk of 256 steps between reads; a flag handed to
// ddp::FusedSGD as found_inf leaves the parameters of exactly the flagged steps untouched.
TEST(NonFiniteSteps, NamesTheFlaggedStepsWhenRead) {
  ddp::NonFiniteSteps checks;
  auto report = checks.read();
  EXPECT_EQ(report.checked, 0);
  EXPECT_EQ(report.flagged, 0);
  const auto finite = std::vector<torch::Tensor>{torch::ones({3}), torch::ones({2, 2}, torch::kDouble)};
  auto withBad = [](float value, bool inDouble) {
    auto a = torch::ones({3});
    auto b = torch::ones({2, 2}, torch::kDouble);
    if (inDouble) b[1][0] = value;
    else a[2] = value;
    return std::vector<torch::Tensor>{a, torch::Tensor(), b};
  };
  // Steps 1..600 (three chunks): flagged at 7 (NaN), 300 (inf, in the double tensor), 598..600 (a run).
  std::vector<int64_t> flaggedSteps = {7, 300, 598, 599, 600};
  std::vector<torch::Tensor> flags;
  for (int64_t step = 1; step <= 600; ++step) {
    const bool bad = std::find(flaggedSteps.begin(), flaggedSteps.end(), step) != flaggedSteps.end();
    flags.push_back(bad ? checks.check(withBad(step == 7 ? NAN : INFINITY, step == 300), step)
                        : checks.check(finite, step));
  }
  EXPECT_EQ(checks.pending(), 600);
  EXPECT_EQ(flags[6].item<float>(), 1.0f);
  EXPECT_EQ(flags[7].item<float>(), 0.0f);
  EXPECT_EQ(flags[299].item<float>(), 1.0f);
  EXPECT_EQ(flags[0].scalar_type(), torch::kFloat);
  report = checks.read();
  EXPECT_EQ(report.checked, 600);
  EXPECT_EQ(report.flagged, 5);
  EXPECT_EQ(report.first, 7);
  EXPECT_EQ(report.inARow, 3);
  EXPECT_EQ(checks.pending(), 0);
  // The run goes on across the read; the reused slots start at zero again.
  checks.check(withBad(-INFINITY, false), 601);
  checks.check(finite, 602);
  report = checks.read();
  EXPECT_EQ(report.flagged, 1);
  EXPECT_EQ(report.first, 601);
  EXPECT_EQ(report.inARow, 0);
  checks.check(withBad(NAN, true), 603);
  checks.check(withBad(NAN, false), 604);
  report = checks.read();
  EXPECT_EQ(report.inARow, 2);
  checks.check(finite, 605);
  report = checks.read();
  EXPECT_EQ(report.flagged, 0);
  EXPECT_EQ(report.first, 0);
  EXPECT_EQ(report.inARow, 0);
  EXPECT_THROW(checks.check({torch::ones({2}, torch::kLong)}, 606), ddp::Error);

  if (!ddp::FusedSGD::available(torch::kCPU)) return;
  auto p = torch::zeros({4}, torch::requires_grad());
  ddp::FusedSGD sgd({p}, torch::optim::SGDOptions(0.5));
  const std::vector<float> values = {1.0f, NAN, 2.0f, INFINITY, 3.0f};
  float expected = 0.0f;
  for (std::size_t i = 0; i < values.size(); ++i) {
    p.mutable_grad() = torch::full({4}, values[i]);
    sgd.fusedStep({}, checks.check({p.grad()}, static_cast<int64_t>(i) + 1), {});
    if (std::isfinite(values[i])) expected -= 0.5f * values[i];
    EXPECT_TRUE(torch::equal(p.detach(), torch::full({4}, expected))) << "step " << i + 1;
  }
  report = checks.read();
  EXPECT_EQ(report.flagged, 2);
  EXPECT_EQ(report.first, 2);
}

}  // namespace
