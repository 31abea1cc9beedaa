// nanoGPT's GPT (worker/models/gpt.h) against tests/python/gpt_reference.py, the reference written
// after nanoGPT's model.py on the pinned PyTorch: our weights load into it with strict=True and give
// its logits, loss and gradients; ten AdamW steps with nanoGPT's two groups give its weights;
// generate draws its tokens; a nanoGPT ckpt.pt's model loads here. Plus the state dict's keys, the
// initialisation, the loader's refusals and the options' one-line errors.
#include "worker/models/gpt.h"
#include "worker/models/models.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "ddp/error.h"
#include "ddp/fused_optim.h"
#include "ddp/state_dict.h"
#include "tests/support/run_command.h"
#include "worker/train/generate_mode.h"

namespace ddp::worker {
namespace {

constexpr int kSteps = 10;
constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.95, kWeightDecay = 0.1;
constexpr double kTolerance = 1e-5;  // fp32 on the CPU

GptOptions smallGpt(bool bias) {
  GptOptions o;
  o.nLayer = 2;
  o.nHead = 2;
  o.nEmbd = 32;
  o.blockSize = 16;
  o.vocabSize = 50;
  o.dropout = 0.0;
  o.bias = bias;
  return o;
}

nlohmann::json configJson(const GptOptions& o) {
  return {{"n_layer", o.nLayer}, {"n_head", o.nHead}, {"n_embd", o.nEmbd}, {"block_size", o.blockSize},
          {"vocab_size", o.vocabSize}, {"dropout", o.dropout}, {"bias", o.bias}};
}

Gpt seededGpt(const GptOptions& o, uint64_t seed = 1234) {
  torch::manual_seed(seed);
  return Gpt(o);
}

// seededGpt's model with every parameter moved by N(0, 0.2): activations and logits of order 1, as
// in a trained model, so that 1e-5 tells formulas apart (at nanoGPT's init the logits are ~0.02 and
// e.g. GELU's tanh approximation would pass).
Gpt parityGpt(const GptOptions& o) {
  Gpt model = seededGpt(o);
  torch::manual_seed(4321);
  c10::NoGradGuard noGrad;
  for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.2);
  return model;
}

double maxDiff(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || !a.sizes().equals(b.sizes())) return INFINITY;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct TempDir {
  std::string path;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir() {
    char pattern[] = "/tmp/ddp_gpt_XXXXXX";
    path = ::mkdtemp(pattern) ? pattern : "";
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

// Runs the reference once on every directory (each with its request.json): one interpreter, as
// importing torch takes seconds. Its replies in the order of `dirs`.
nlohmann::json runReference(const std::vector<std::string>& dirs, const std::vector<nlohmann::json>& requests) {
  std::vector<std::string> command = {DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/gpt_reference.py"};
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::ofstream(dirs[i] + "/request.json") << requests[i].dump();
    command.push_back(dirs[i]);
  }
  const auto run = ddp::test::runCommand(command, ddp::test::stdoutOnly());
  if (run.exitCode != 0) ADD_FAILURE() << "the reference failed (exit " << run.exitCode << "): " << run.output;
  return nlohmann::json::parse(run.exitCode == 0 ? run.output : "[]");
}

// (x, y) and one batch per AdamW step, [3, block_size] each.
ddp::StateDict batches(const GptOptions& o) {
  torch::manual_seed(99);
  ddp::StateDict b{{"x", torch::randint(o.vocabSize, {3, o.blockSize})},
                   {"y", torch::randint(o.vocabSize, {3, o.blockSize})}};
  for (int i = 0; i < kSteps; ++i) {
    b["x" + std::to_string(i)] = torch::randint(o.vocabSize, {3, o.blockSize});
    b["y" + std::to_string(i)] = torch::randint(o.vocabSize, {3, o.blockSize});
  }
  return b;
}

struct Reference {
  ddp::StateDict batch;
  ddp::StateDict out;  // out.pt: logits, loss, grad.*, adamw.*, fused.*, generated
  nlohmann::json numbers;
};

// A nanoGPT ckpt.pt the reference wrote: its 'model' dict, and a batch "x" with its "logits".
struct Checkpoint {
  ddp::StateDict model;
  std::map<std::string, std::string> modelArgs;  // ckpt.pt's "model_args", as ddp::readModelFile gives them
  ddp::StateDict out;
  std::string error;  // reading ckpt.pt failed
};

constexpr int64_t kMaxNewTokens = 30;  // from 4 tokens past block_size 16: generate crops
constexpr double kTemperature = 0.8, kTokensPerIter = 12 * 16, kSeconds = 0.25, kPeak = 312e12;
constexpr int64_t kTopK = 5, kSampleSeed = 7;

nlohmann::json parityRequest(const GptOptions& o) {
  return {{"config", configJson(o)}, {"task", "parity"}, {"lr", kLr}, {"betas", {kBeta1, kBeta2}},
          {"weight_decay", kWeightDecay}, {"steps", kSteps},
          {"generate", {{"max_new_tokens", kMaxNewTokens}, {"temperature", kTemperature}, {"top_k", kTopK},
                        {"seed", kSampleSeed}}},
          {"mfu", {{"tokens_per_iter", kTokensPerIter}, {"seconds", kSeconds}, {"peak_flops", kPeak}}}};
}

ddp::StateDict tensorsIfThere(const std::string& path) {
  return std::filesystem::exists(path) ? ddp::loadTensors(path) : ddp::StateDict{};
}

// The reference's answers for both bias settings, computed once for all the tests below (the model
// is parityGpt's every time).
struct References {
  std::map<bool, Reference> parity;
  std::map<bool, Checkpoint> checkpoint;
};

const References& references() {
  static const References refs = [] {
    References r;
    std::vector<TempDir> dirs(4);
    std::vector<std::string> paths;
    std::vector<nlohmann::json> requests;
    for (bool bias : {true, false}) {
      const GptOptions o = smallGpt(bias);
      const std::string& dir = dirs[paths.size()].path;
      r.parity[bias].batch = batches(o);
      ddp::saveStateDict(gptStateDict(parityGpt(o)), dir + "/weights.pt");
      ddp::saveStateDict(r.parity[bias].batch, dir + "/batch.pt");
      paths.push_back(dir);
      requests.push_back(parityRequest(o));
      paths.push_back(dirs[paths.size()].path);
      requests.push_back({{"config", configJson(o)}, {"task", "checkpoint"}, {"seed", 31}});
    }
    const nlohmann::json replies = runReference(paths, requests);
    for (size_t i = 0; i < paths.size(); ++i) {
      const bool bias = i < 2;
      if (i % 2 == 0) {
        r.parity[bias].out = tensorsIfThere(paths[i] + "/out.pt");
        if (i < replies.size()) r.parity[bias].numbers = replies[i];
      } else {
        r.checkpoint[bias].out = tensorsIfThere(paths[i] + "/out.pt");
        try {
          ddp::ModelFile file = ddp::readModelFile(paths[i] + "/ckpt.pt");
          r.checkpoint[bias].model = std::move(file.state);
          r.checkpoint[bias].modelArgs = std::move(file.modelArgs);
        } catch (const ddp::Error& e) {
          r.checkpoint[bias].error = e.what();
        }
      }
    }
    return r;
  }();
  return refs;
}

const Reference& reference(bool bias) { return references().parity.at(bias); }

class GptParity : public ::testing::TestWithParam<bool> {};

TEST_P(GptParity, LogitsLossAndGradientsEqualTheReference) {
  const Reference& ref = reference(GetParam());
  ASSERT_TRUE(ref.out.count("logits")) << "no reference output";
  Gpt model = parityGpt(smallGpt(GetParam()));
  const at::Tensor logits = model->forward(ref.batch.at("x"));
  const at::Tensor loss = gptLoss(logits, ref.batch.at("y"));
  loss.backward();
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 16, 50}));
  EXPECT_LE(maxDiff(logits, ref.out.at("logits")), kTolerance);
  EXPECT_LE(maxDiff(loss, ref.out.at("loss")), kTolerance) << loss.item<double>();
  size_t compared = 0;
  double worstGrad = 0;
  for (const auto& item : model->named_parameters()) {
    auto it = ref.out.find("grad." + item.key());
    ASSERT_NE(it, ref.out.end()) << item.key() << " is not a parameter of the reference";
    const double d = maxDiff(item.value().grad(), it->second);
    EXPECT_LE(d, kTolerance) << item.key();
    worstGrad = std::max(worstGrad, d);
    ++compared;
  }
  // The figures (--gtest_output=json): how close, not only whether within the tolerance.
  RecordProperty("logits_max_abs_diff", std::to_string(maxDiff(logits, ref.out.at("logits")) * 1e9) + "e-9");
  RecordProperty("logits_max_abs", std::to_string(logits.abs().max().item<double>()));
  RecordProperty("loss", std::to_string(loss.item<double>()));
  RecordProperty("grads_max_abs_diff", std::to_string(worstGrad * 1e9) + "e-9");
  size_t referenceGrads = 0;
  for (const auto& entry : ref.out) referenceGrads += entry.first.rfind("grad.", 0) == 0;
  EXPECT_EQ(compared, referenceGrads);  // the same parameters, each once (the tied head too)
}

void expectWeightsAfterSteps(Gpt& model, torch::optim::Optimizer& optimizer, const Reference& ref,
                             const std::string& prefix) {
  for (int i = 0; i < kSteps; ++i) {
    optimizer.zero_grad();
    const at::Tensor x = ref.batch.at("x" + std::to_string(i)), y = ref.batch.at("y" + std::to_string(i));
    gptLoss(model->forward(x), y).backward();
    optimizer.step();
  }
  double worst = 0;
  const std::string attnBias = "attn.c_attn.bias";
  for (const auto& item : model->named_parameters()) {
    auto it = ref.out.find(prefix + item.key());
    ASSERT_NE(it, ref.out.end()) << prefix << item.key();
    const std::string& name = item.key();
    if (name.size() > attnBias.size() && name.compare(name.size() - attnBias.size(), attnBias.size(), attnBias) == 0) {
      // The key bias's gradient is zero in exact arithmetic (softmax ignores a shift q·b shared by all
      // keys), so both sides step it by rounding noise that Adam scales up to ~lr: equal within the
      // steps' reach only. Queries and values as every other weight.
      const int64_t width = item.value().size(0) / 3;
      for (int64_t part : {0, 2}) {
        EXPECT_LE(maxDiff(item.value().narrow(0, part * width, width), it->second.narrow(0, part * width, width)),
                  kTolerance) << prefix << name << (part == 0 ? " (queries)" : " (values)");
      }
      EXPECT_LE(maxDiff(item.value().narrow(0, width, width), it->second.narrow(0, width, width)), kSteps * kLr)
          << prefix << name << " (keys)";
      continue;
    }
    const double d = maxDiff(item.value(), it->second);
    EXPECT_LE(d, kTolerance) << prefix << name;
    worst = std::max(worst, d);
  }
  ::testing::Test::RecordProperty("weights_max_abs_diff", std::to_string(worst * 1e9) + "e-9");
}

std::unique_ptr<torch::optim::AdamWOptions> adamw(double weightDecay) {
  return std::make_unique<torch::optim::AdamWOptions>(
      torch::optim::AdamWOptions(kLr).betas({kBeta1, kBeta2}).weight_decay(weightDecay));
}

TEST_P(GptParity, TenAdamWStepsWithNanoGptsGroupsEqualTheReference) {
  const Reference& ref = reference(GetParam());
  ASSERT_TRUE(ref.out.count("logits")) << "no reference output";
  Gpt model = parityGpt(smallGpt(GetParam()));
  const GptParameterGroups groups = gptParameterGroups(model);
  std::vector<torch::optim::OptimizerParamGroup> paramGroups;
  paramGroups.emplace_back(groups.decay, adamw(kWeightDecay));
  paramGroups.emplace_back(groups.noDecay, adamw(0.0));
  torch::optim::AdamW optimizer(paramGroups, *adamw(0.0));
  expectWeightsAfterSteps(model, optimizer, ref, "adamw.");
}

TEST_P(GptParity, FusedAdamWWithTwoGroupsEqualsFusedPyTorch) {
  if (!ddp::FusedAdamW::available(c10::DeviceType::CPU)) GTEST_SKIP() << "no fused Adam kernel in this LibTorch";
  const Reference& ref = reference(GetParam());
  ASSERT_TRUE(ref.out.count("logits")) << "no reference output";
  Gpt model = parityGpt(smallGpt(GetParam()));
  const GptParameterGroups groups = gptParameterGroups(model);
  ddp::FusedAdamWOptions options;
  options.lr = kLr;
  options.beta1 = kBeta1;
  options.beta2 = kBeta2;
  options.weightDecay = kWeightDecay;
  ddp::FusedAdamW optimizer(groups.decay, options);
  optimizer.add_param_group(torch::optim::OptimizerParamGroup(groups.noDecay, adamw(0.0)));
  expectWeightsAfterSteps(model, optimizer, ref, "fused.");
}

TEST_P(GptParity, GenerateDrawsTheReferencesTokens) {
  const Reference& ref = reference(GetParam());
  ASSERT_TRUE(ref.out.count("generated")) << "no reference output";
  Gpt model = parityGpt(smallGpt(GetParam()));
  model->eval();
  const at::Tensor start = ref.batch.at("x").slice(1, 0, 4);
  const at::Tensor got = model->generate(start, kMaxNewTokens, kTemperature, kTopK,
                                         at::make_generator<at::CPUGeneratorImpl>(kSampleSeed));
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{3, 4 + kMaxNewTokens}));
  EXPECT_TRUE(torch::equal(got, ref.out.at("generated"))) << got << "\nvs\n" << ref.out.at("generated");
}

TEST_P(GptParity, ParameterCountAndMfuAreNanoGpts) {
  const Reference& ref = reference(GetParam());
  ASSERT_TRUE(ref.numbers.contains("num_params")) << "no reference output";
  Gpt model = parityGpt(smallGpt(GetParam()));
  EXPECT_EQ(model->numParameters(), ref.numbers["num_params"].get<int64_t>());
  EXPECT_EQ(model->numParameters(false), ref.numbers["num_params_all"].get<int64_t>());
  EXPECT_DOUBLE_EQ(model->flopsPerToken(), ref.numbers["flops_per_token"].get<double>());
  EXPECT_NEAR(model->estimateMfu(kTokensPerIter, kSeconds, kPeak), ref.numbers["mfu"].get<double>(),
              1e-12 * ref.numbers["mfu"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(Bias, GptParity, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "WithBias" : "WithoutBias"; });

std::set<std::string> nanoGptKeys(const GptOptions& o) {
  std::set<std::string> keys = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                                "lm_head.weight"};
  if (o.bias) keys.insert("transformer.ln_f.bias");
  for (int64_t i = 0; i < o.nLayer; ++i) {
    const std::string block = "transformer.h." + std::to_string(i) + ".";
    for (const char* part : {"ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"}) {
      keys.insert(block + part + ".weight");
      if (o.bias) keys.insert(block + part + ".bias");
    }
  }
  return keys;
}

TEST(Gpt, StateDictHasNanoGptsKeysAndTheTiedHeadOnce) {
  for (bool bias : {true, false}) {
    const GptOptions o = smallGpt(bias);
    Gpt model = seededGpt(o);
    const ddp::StateDict state = gptStateDict(model);
    std::set<std::string> keys;
    for (const auto& entry : state) keys.insert(entry.first);
    EXPECT_EQ(keys, nanoGptKeys(o)) << "bias " << bias;
    EXPECT_TRUE(torch::equal(state.at("lm_head.weight"), state.at("transformer.wte.weight")));
    std::set<const c10::TensorImpl*> distinct;
    for (const auto& p : model->parameters()) distinct.insert(p.unsafeGetTensorImpl());
    EXPECT_EQ(distinct.size(), model->parameters().size());  // DDP and the optimizer see wte once
    EXPECT_EQ(model->parameters().size(), keys.size() - 1);
    const GptParameterGroups groups = gptParameterGroups(model);
    EXPECT_EQ(groups.decay.size(), 2u + 4u * o.nLayer);  // wte, wpe; c_attn, c_proj, c_fc, c_proj
    EXPECT_EQ(groups.noDecay.size(), bias ? 1u + 1u + 8u * o.nLayer : 1u + 2u * o.nLayer);
    for (const auto& p : groups.decay) EXPECT_GE(p.dim(), 2);
    for (const auto& p : groups.noDecay) EXPECT_LT(p.dim(), 2);
  }
}

double stdOf(const at::Tensor& t) { return t.std().item<double>(); }

TEST(Gpt, InitialisationIsNanoGpts) {
  GptOptions o;
  o.nLayer = 4;
  o.nHead = 4;
  o.nEmbd = 128;
  o.blockSize = 64;
  o.vocabSize = 1000;
  Gpt model = seededGpt(o, 5);
  const double residual = 0.02 / std::sqrt(2.0 * o.nLayer);
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    const bool cProj = name.find("c_proj.weight") != std::string::npos;
    if (name.find("ln_") != std::string::npos) {
      EXPECT_TRUE(torch::equal(p, name.find(".weight") != std::string::npos ? torch::ones_like(p) : torch::zeros_like(p)))
          << name;
    } else if (name.find(".bias") != std::string::npos) {
      EXPECT_EQ(p.abs().max().item<double>(), 0.0) << name;
    } else {
      EXPECT_NEAR(stdOf(p), cProj ? residual : 0.02, 0.05 * (cProj ? residual : 0.02)) << name;
      EXPECT_NEAR(p.mean().item<double>(), 0.0, 0.002) << name;
    }
  }
}

TEST(Gpt, LoadsANanoGptCheckpointWithTheCompilePrefix) {
  for (bool bias : {true, false}) {
    const Checkpoint& ckpt = references().checkpoint.at(bias);
    ASSERT_TRUE(ckpt.out.count("logits")) << "no reference output";
    ASSERT_EQ(ckpt.error, "");
    ASSERT_TRUE(ckpt.model.count("_orig_mod.lm_head.weight")) << "bias " << bias;
    Gpt model = seededGpt(smallGpt(bias), 77);  // other weights until the load
    loadGptStateDict(model, ckpt.model);
    model->eval();
    c10::NoGradGuard noGrad;
    EXPECT_LE(maxDiff(model->forward(ckpt.out.at("x")), ckpt.out.at("logits")), kTolerance) << "bias " << bias;
  }
}

// nanoGPT's model_args hold n_head, which no tensor's shape shows: a run of another n_head is
// refused by them, naming the key and the value to set; the model's own settings load.
TEST(Gpt, ANanoGptCheckpointsModelArgsAreCheckedBeforeItsWeightsLoad) {
  const Checkpoint& ckpt = references().checkpoint.at(true);
  ASSERT_EQ(ckpt.error, "");
  const GptOptions o = smallGpt(true);
  // What the reference's dict(cfg) pickled, as Python's repr shows it.
  const std::map<std::string, std::string> expected = {
      {"n_layer", std::to_string(o.nLayer)}, {"n_head", std::to_string(o.nHead)}, {"n_embd", std::to_string(o.nEmbd)},
      {"block_size", std::to_string(o.blockSize)}, {"vocab_size", std::to_string(o.vocabSize)},
      {"dropout", "0.0"}, {"bias", "true"}};
  EXPECT_EQ(ckpt.modelArgs, expected);

  GptOptions otherHeads = o;
  otherHeads.nHead = 4;  // the same shapes: without model_args the weights would load
  otherHeads.dropout = 0.1;  // may differ (fine-tuning with dropout), not reported
  Gpt model = seededGpt(otherHeads, 5);
  const at::Tensor before = model->transformer->wte->weight.clone();
  ddp::ModelFile file{ckpt.model, ckpt.modelArgs, ""};
  std::string error;
  try {
    loadGptModelFile(*model, file, "ckpt.pt");
  } catch (const ddp::CheckpointError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("'ckpt.pt': the GPT that wrote it differs from this run's model.* (its model_args vs this "
                       "run's): n_head 2 vs 4 (n_head shapes no tensor"), std::string::npos) << error;
  EXPECT_NE(error.find("; set model.n_head=2"), std::string::npos) << error;
  EXPECT_EQ(error.find("dropout"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_TRUE(torch::equal(model->transformer->wte->weight, before));
  loadGptStateDict(*model, ckpt.model);  // what the check prevents: the shapes fit
  EXPECT_TRUE(torch::equal(model->transformer->wte->weight, ckpt.model.at("_orig_mod.transformer.wte.weight")));

  Gpt same = seededGpt(o, 6);
  loadGptModelFile(*same, file, "ckpt.pt");
  same->eval();
  c10::NoGradGuard noGrad;
  EXPECT_LE(maxDiff(same->forward(ckpt.out.at("x")), ckpt.out.at("logits")), kTolerance);
}

// Our training checkpoint records its run's config: model.* there is checked the same way.
TEST(Gpt, OurCheckpointsRecordedConfigIsCheckedBeforeItsWeightsLoad) {
  const GptOptions o = smallGpt(false);
  // The shipped config's run, as its checkpoint records it (vocab_size 0: the data's, which the
  // embedding's shape shows, so not compared).
  auto set = [](const char* key, int64_t value) { return std::string(key).append(std::to_string(value)); };
  WorkerConfig saved = loadConfig(std::string(DDP_SOURCE_DIR).append("/configs/gpt_fortunes_char.yaml"),
                                  {set("model.n_layer=", o.nLayer), "model.n_head=4", set("model.n_embd=", o.nEmbd),
                                   set("model.block_size=", o.blockSize), "model.bias=true"});
  ASSERT_EQ(saved.model.vocabSize, 0);
  ddp::ModelFile file{gptStateDict(seededGpt(o, 1)), {}, dumpConfig(saved)};
  Gpt model = seededGpt(o, 2);
  std::string error;
  try {
    loadGptModelFile(*model, file, "ckpt-8.pt");
  } catch (const ddp::CheckpointError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("(its run's config vs this run's): n_head 4 vs 2, bias true vs false"), std::string::npos) << error;
  EXPECT_NE(error.find("; set model.n_head=4 model.bias=true"), std::string::npos) << error;
  EXPECT_EQ(error.find("vocab_size"), std::string::npos) << error;

  saved.model.nHead = o.nHead;
  saved.model.bias = false;
  file.config = dumpConfig(saved);
  loadGptModelFile(*model, file, "ckpt-8.pt");
  EXPECT_TRUE(torch::equal(model->transformer->wte->weight, file.state.at("transformer.wte.weight")));
}

std::string loadError(Gpt& model, ddp::StateDict state) {
  try {
    loadGptStateDict(model, std::move(state));
  } catch (const ddp::CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(Gpt, LoadRefusesWhatDoesNotFitInOneLineBeforeChangingAnything) {
  const ddp::StateDict source = gptStateDict(seededGpt(smallGpt(true), 1));
  Gpt model = seededGpt(smallGpt(true), 2);
  const at::Tensor before = model->transformer->wte->weight.clone();

  ddp::StateDict bad = source;
  bad.erase("transformer.h.1.mlp.c_fc.bias");
  bad["transformer.h.2.ln_1.weight"] = torch::ones({32});
  bad["transformer.wpe.weight"] = torch::zeros({20, 32});
  const std::string all = loadError(model, bad);
  EXPECT_NE(all.find("missing keys: transformer.h.1.mlp.c_fc.bias [128]"), std::string::npos) << all;
  EXPECT_NE(all.find("unexpected keys: transformer.h.2.ln_1.weight"), std::string::npos) << all;
  EXPECT_NE(all.find("transformer.wpe.weight [20, 32] in the file vs [16, 32] in the model"), std::string::npos) << all;
  EXPECT_EQ(all.find('\n'), std::string::npos) << all;
  EXPECT_TRUE(torch::equal(model->transformer->wte->weight, before));

  ddp::StateDict untied = source;
  untied["lm_head.weight"] = untied["lm_head.weight"] + 1;
  const std::string head = loadError(model, untied);
  EXPECT_NE(head.find("lm_head.weight differs from its transformer.wte.weight"), std::string::npos) << head;
  EXPECT_TRUE(torch::equal(model->transformer->wte->weight, before));

  // Another model's file (the MLP's keys): said so in a short line, not every GPT key as missing.
  const std::string mlp = loadError(model, {{"fc1.weight", torch::ones({4, 4})}, {"fc1.bias", torch::ones({4})},
                                            {"fc2.weight", torch::ones({2, 4})}, {"fc2.bias", torch::ones({2})}});
  EXPECT_NE(mlp.find("not a GPT's state dict: none of its 4 keys (fc1.bias, fc1.weight, fc2.bias, ... (1 more)) is a "
                     "GPT's"),
            std::string::npos)
      << mlp;
  EXPECT_LT(mlp.size(), 300u) << mlp;
  EXPECT_TRUE(torch::equal(model->transformer->wte->weight, before));

  const std::string noBias = loadError(model, gptStateDict(seededGpt(smallGpt(false), 1)));
  EXPECT_NE(noBias.find("missing keys: transformer.h.0.attn.c_attn.bias [96]"), std::string::npos) << noBias;
  // What the file's shapes say to set (smallGpt's sizes; n_head is in no shape).
  EXPECT_NE(noBias.find("the file's GPT has model.n_layer=2 model.n_embd=32 model.block_size=16 model.vocab_size=50 "
                        "model.bias=false (and the n_head of the run that wrote it): set model.* to those"),
            std::string::npos)
      << noBias;
  EXPECT_NE(all.find("the file's GPT has model.n_layer=3 model.n_embd=32 model.block_size=20"), std::string::npos)
      << all;

  ddp::StateDict wrapped;  // DDP's prefix, and no lm_head: accepted
  for (const auto& [key, tensor] : source) {
    if (key != "lm_head.weight") wrapped["module." + key] = tensor;
  }
  EXPECT_EQ(loadError(model, wrapped), "");
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), source.at(item.key()))) << item.key();
  }
}

std::string configError(const GptOptions& o) {
  try {
    Gpt model(o);
  } catch (const ddp::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Gpt, BadOptionsAndInputsGiveOneLineNamingTheKey) {
  GptOptions o = smallGpt(true);
  o.nEmbd = 100;
  o.nHead = 3;
  EXPECT_EQ(configError(o), "config: model.n_embd (100) must be divisible by model.n_head (3): each head gets "
                            "n_embd / n_head channels; use e.g. model.n_embd: 99 or 102");
  o = smallGpt(true);
  o.nLayer = 0;
  EXPECT_EQ(configError(o), "config: model.n_layer (0) must be at least 1");
  o = smallGpt(true);
  o.vocabSize = -1;
  EXPECT_EQ(configError(o), "config: model.vocab_size (-1) must be at least 1");
  o = smallGpt(true);
  o.dropout = 1.0;
  EXPECT_EQ(configError(o), "config: model.dropout (1) must be in [0, 1); 0 switches it off");

  Gpt model = seededGpt(smallGpt(true));
  try {
    model->forward(torch::zeros({2, 17}, torch::kLong));
    ADD_FAILURE() << "17 tokens went through block_size 16";
  } catch (const ddp::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "config: a sequence of 17 tokens does not fit model.block_size (16); raise "
                                     "model.block_size to 17 or feed at most 16 tokens");
  }
  EXPECT_THROW(model->generate(torch::zeros({1, 2}, torch::kLong), 3, 0.0), ddp::ConfigError);
  EXPECT_THROW(model->generate(torch::zeros({1, 2}, torch::kLong), 3, 1.0, 0), ddp::ConfigError);
}

TEST(Gpt, CloneComputesTheSameWithItsOwnWeightsAndDropoutFollowsTheMode) {
  GptOptions o = smallGpt(true);
  o.dropout = 0.2;
  Gpt model = seededGpt(o);
  model->eval();
  auto copy = std::dynamic_pointer_cast<GptImpl>(model->clone());
  ASSERT_NE(copy, nullptr);
  copy->eval();
  const at::Tensor x = torch::randint(o.vocabSize, {2, o.blockSize});
  c10::NoGradGuard noGrad;
  const at::Tensor want = model->forward(x);
  EXPECT_TRUE(torch::equal(copy->forward(x), want));
  copy->transformer->wte->weight.add_(1.0);  // the clone's own tensors, through the tied head too
  EXPECT_TRUE(torch::equal(model->forward(x), want));
  EXPECT_FALSE(torch::equal(copy->forward(x), want));
  model->train();
  EXPECT_FALSE(torch::equal(model->forward(x), model->forward(x)));
}

// mode generate's decoding: a model.vocab_size padded past the data's (nanoGPT pads GPT-2's 50257 to
// 50304) can sample a token the data never had; it has no text at either level (a byte level once
// wrapped it into byte t % 256).
TEST(Vocabulary, TokensPastTheDataVocabularyHaveNoTextAndAreCounted) {
  const std::string dir = test::makeTempDir("vocabulary");
  std::ofstream(dir + "/byte.json") << R"({"level": "byte", "vocab_size": 256})";
  std::ofstream(dir + "/char.json") << R"({"level": "char", "vocab_size": 3, "itos": ["a", "b", "\u00e9"]})";
  int64_t outside = -1;
  EXPECT_EQ(Vocabulary(dir + "/byte.json").decode({72, 105, 256, 328, -1, 33}, &outside), "Hi!");
  EXPECT_EQ(outside, 3);
  EXPECT_EQ(Vocabulary(dir + "/char.json").decode({0, 1, 2, 3, 72}, &outside), "ab\xc3\xa9");
  EXPECT_EQ(outside, 2);
  EXPECT_EQ(Vocabulary(dir + "/byte.json").decode({255}, &outside), "\xff");
  EXPECT_EQ(outside, 0);
}

}  // namespace
}  // namespace ddp::worker
