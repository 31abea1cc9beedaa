// Tier 3: real worker processes started by the real ddp-launch over loopback
// Gloo. After K steps every rank must hold identical parameters, equal (1e-5)
// to a plain single-process LibTorch run on the concatenated per-rank batches,
// for every reducer option; buffers must follow rank 0's (broadcast_buffers).
#include <gtest/gtest.h>

#include <ATen/ops/cat.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "ddp/clip_grad.h"
#include "ddp/lr_schedule.h"
#include "sampler/batching.h"
#include "sampler/distributed_sampler.h"
#include "tests/support/run_command.h"
#include "worker/config/config.h"
#include "worker/data/gather_batch.h"
#include "ddp/state_dict.h"
#include "worker/models/models.h"
#include "worker/train/trainer.h"

namespace ddp {
namespace {

using worker::WorkerConfig;

using test::makeTempDir;

struct Reference {
  std::map<std::string, at::Tensor> state;                   // parameters and rank 0's buffers
  std::vector<std::map<std::string, at::Tensor>> rankBuffers;  // every rank's buffers at the end
};

std::map<std::string, at::Tensor> buffersOf(const torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : m.named_buffers(true)) out[item.key()] = item.value().detach().clone();
  return out;
}

void loadBuffers(torch::nn::Module& m, const std::map<std::string, at::Tensor>& values) {
  torch::NoGradGuard noGrad;
  for (auto& item : m.named_buffers(true)) item.value().copy_(values.at(item.key()));
}

/// train.optimizer as LibTorch has it, in one process.
std::unique_ptr<torch::optim::Optimizer> referenceOptimizer(const worker::TrainConfig& t, torch::nn::Module& module) {
  if (t.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        module.parameters(),
        torch::optim::AdamWOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
  }
  if (t.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        module.parameters(),
        torch::optim::AdamOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
  }
  return std::make_unique<torch::optim::SGD>(
      module.parameters(),
      torch::optim::SGDOptions(t.lr).momentum(t.momentum).weight_decay(t.weightDecay).nesterov(t.nesterov));
}

/// The reference: one process, one model, the plain LibTorch optimizer (at the lr of the schedule,
/// gradients clipped as configured: both checked against PyTorch in api_recipes), no communication.
/// Without BatchNorm each step is one batch: the union of every rank's
/// `accumulate` micro-batches (so accumulation over k micro-batches is checked
/// against one batch k times larger). With BatchNorm, whose statistics are per
/// forward, each (rank, micro-batch) is its own forward with that rank's buffers
/// (rank 0's copied to all before a step when broadcast_buffers), and the
/// losses are averaged: DDP's semantics written out sequentially.
Reference referenceRun(const WorkerConfig& config, int world) {
  const worker::Datasets data = worker::loadDatasets(config.data, config.seed);
  torch::manual_seed(config.seed);
  auto model = worker::makeModel(config.model, data.input);
  auto& module = *model.ptr();
  const auto optimizer = referenceOptimizer(config.train, module);
  ddp::LrScheduleOptions lr;
  lr.kind = config.train.lrSchedule;
  lr.baseLr = config.train.lr;
  lr.warmupSteps = config.train.warmupSteps;
  lr.totalSteps = config.train.maxSteps;  // the cases run max_steps steps, well inside train.epochs
  lr.minLr = config.train.minLr;
  lr.stepSize = std::max<int64_t>(1, config.train.stepSize);
  lr.gamma = config.train.gamma;
  const ddp::LrSchedule schedule(lr);
  // SyncBatchNorm's statistics are the whole batch's: one forward over the union, as without BatchNorm.
  const bool perForward = config.model.batchNorm && !config.model.syncBatchNorm;
  const int64_t k = config.train.accumulateSteps;
  const int64_t batch = perForward ? config.train.batchSize : config.train.batchSize * k;
  const int64_t window = perForward ? k : 1;  // sampler batches per optimizer step
  std::vector<sampler::DistributedSampler> samplers;
  for (int r = 0; r < world; ++r) {
    sampler::DistributedSamplerOptions o;
    o.numReplicas = world;
    o.rank = r;
    o.seed = config.seed;
    o.shuffle = config.train.shuffle;
    samplers.emplace_back(data.train.size(), o);
  }
  std::vector<std::map<std::string, at::Tensor>> buffers(world, buffersOf(module));
  int64_t steps = 0;
  for (int64_t epoch = 0; steps < config.train.maxSteps; ++epoch) {
    std::vector<std::vector<std::vector<int64_t>>> perRank;
    for (auto& s : samplers) {
      s.setEpoch(epoch);
      perRank.push_back(sampler::makeBatches(s.indices(), batch, false));
    }
    const int64_t n = static_cast<int64_t>(perRank[0].size());
    for (int64_t first = 0; first < n && steps < config.train.maxSteps; first += window, ++steps) {
      const int64_t count = std::min(window, n - first);
      optimizer->zero_grad();
      if (!perForward) {
        std::vector<int64_t> all;
        for (int r = 0; r < world; ++r) all.insert(all.end(), perRank[r][first].begin(), perRank[r][first].end());
        const auto b = worker::data::gatherBatch(data.train, all);
        torch::nn::functional::cross_entropy(model.forward(b.images), b.labels).backward();
      } else {
        if (config.comm.ddp.broadcastBuffers) buffers.assign(world, buffers[0]);
        for (int r = 0; r < world; ++r) {
          loadBuffers(module, buffers[r]);
          for (int64_t m = 0; m < count; ++m) {
            const auto b = worker::data::gatherBatch(data.train, perRank[r][first + m]);
            (torch::nn::functional::cross_entropy(model.forward(b.images), b.labels) /
             static_cast<double>(world * count)).backward();
          }
          buffers[r] = buffersOf(module);
        }
      }
      if (config.train.clipGradNorm > 0) ddp::clipGradNorm(module.parameters(), config.train.clipGradNorm);
      schedule.apply(*optimizer, steps);
      optimizer->step();
    }
  }
  if (perForward) loadBuffers(module, buffers[0]);
  if (!perForward) buffers.assign(world, buffersOf(module));  // every rank ends with the whole batch's
  return {ddp::stateDict(module), buffers};
}

struct Case {
  int world;
  std::string model;  // mlp | cnn | cnn_bn | cnn_sbn (SyncBatchNorm)
  int64_t trainSize;
  int64_t maxSteps;
  std::vector<std::string> options;  // comm.* / train.accumulate_steps overrides
  double tolerance = 1e-5;
};

std::ostream& operator<<(std::ostream& out, const Case& c) {
  out << c.world << "ranks_" << c.model << "_n" << c.trainSize << "_k" << c.maxSteps;
  for (const auto& o : c.options) {
    std::string word = o.substr(o.find('.') + 1);
    for (char& ch : word) if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    out << "_" << word;
  }
  return out;
}

std::vector<std::string> overridesFor(const Case& c, const std::string& dir) {
  std::vector<std::string> o = {
      "mode=ddp", "seed=3", "model.name=" + std::string(c.model == "mlp" ? "mlp" : "cnn"),
      "model.batch_norm=" + std::string(c.model == "cnn_bn" || c.model == "cnn_sbn" ? "true" : "false"),
      "model.sync_batch_norm=" + std::string(c.model == "cnn_sbn" ? "true" : "false"),
      "model.hidden=[32]", "data.name=synthetic",
      "data.synthetic_train=" + std::to_string(c.trainSize), "data.synthetic_test=64",
      "train.batch_size=8", "train.lr=0.1", "train.momentum=0.9", "train.epochs=100",
      "train.max_steps=" + std::to_string(c.maxSteps), "eval.enabled=false",
      "output.dir=" + dir, "output.dump_rank_params=true"};
  o.insert(o.end(), c.options.begin(), c.options.end());
  return o;
}

test::CommandResult launch(int world, const std::vector<std::string>& overrides) {
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(world),
                                   DDP_WORKER_BIN, std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml"};
  argv.insert(argv.end(), overrides.begin(), overrides.end());
  return test::runCommand(argv, 240);
}

bool isBuffer(const std::string& key) {
  return key.find("running_") != std::string::npos || key.find("num_batches") != std::string::npos;
}

class DdpEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(DdpEquivalence, RanksAgreeAndMatchSingleProcessOnConcatenatedBatches) {
  const Case c = GetParam();
  const std::string dir = makeTempDir("equiv");
  const auto overrides = overridesFor(c, dir);
  const auto run = launch(c.world, overrides);
  ASSERT_EQ(run.exitCode, 0) << run.output;

  const WorkerConfig config =
      worker::loadConfig(std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml", overrides);
  const Reference expected = referenceRun(config, c.world);
  const auto rank0 = ddp::loadTensors(dir + "/rank0_params.pt");
  ASSERT_EQ(rank0.size(), expected.state.size());
  for (int r = 0; r < c.world; ++r) {
    const auto other = ddp::loadTensors(dir + "/rank" + std::to_string(r) + "_params.pt");
    for (const auto& [key, value] : rank0) {
      if (isBuffer(key)) {
        // Rank r's buffers: rank 0's at the step's start (broadcast), then its own forwards.
        const at::Tensor want = expected.rankBuffers[r].at(key).to(value.dtype());
        const double diff = (other.at(key) - want).abs().max().item<double>();
        EXPECT_LT(diff, c.tolerance) << "rank " << r << " buffer " << key << " off by " << diff;
      } else {
        EXPECT_TRUE(at::equal(value, other.at(key))) << "rank " << r << " differs from rank 0 in " << key;
      }
    }
  }
  for (const auto& [key, value] : expected.state) {
    ASSERT_TRUE(rank0.count(key)) << key;
    const double diff = (rank0.at(key) - value).abs().max().item<double>();
    EXPECT_LT(diff, c.tolerance) << key << " differs from the single-process reference by " << diff;
  }
  // The export is rank 0's parameters under plain keys.
  const auto exported = ddp::loadTensors(dir + "/model.pt");
  for (const auto& [key, value] : rank0) EXPECT_TRUE(at::equal(value, exported.at(key))) << key;
  // The samples of one optimizer step: every rank's micro-batches of every accumulation.
  const auto summary = nlohmann::json::parse(test::readFile(dir + "/summary.json"));
  EXPECT_EQ(summary["global_batch_size"].get<int64_t>(),
            config.train.batchSize * config.train.accumulateSteps * c.world);
  std::filesystem::remove_all(dir);
}

TEST(DdpUnusedParameter, WithoutFindUnusedFailsFastNamingTheParameter) {
  const std::string dir = makeTempDir("unused");
  const Case c{2, "mlp", 64, 3, {"model.unused_layer=true", "comm.find_unused_parameters=false"}};
  const auto started = std::chrono::steady_clock::now();
  const auto run = launch(2, overridesFor(c, dir));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_FALSE(run.timedOut) << "hung instead of failing";
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_LT(seconds, 60) << "should fail at the first backward, not at a timeout";
  EXPECT_NE(run.output.find("unused.weight"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("comm.find_unused_parameters=true"), std::string::npos) << run.output;
  std::filesystem::remove_all(dir);
}

// Every option of the bucketed reducer, crossed, on the MLP (small caps make one bucket per
// parameter); then BatchNorm, compression, world 4 and the flat path.
std::vector<Case> allCases() {
  std::vector<Case> cases;
  const std::string tiny = "comm.first_bucket_mb=0.0001";
  for (const char* view : {"false", "true"}) {
    for (bool small : {false, true}) {
      for (const char* unused : {"false", "true"}) {
        for (int k : {1, 2}) {
          std::vector<std::string> o = {std::string("comm.gradient_as_bucket_view=") + view,
                                        std::string("comm.find_unused_parameters=") + unused,
                                        "train.accumulate_steps=" + std::to_string(k)};
          if (small) {
            o.push_back(tiny);
            o.push_back("comm.bucket_cap_mb=0.0001");
          }
          if (std::string(unused) == "true") o.push_back("model.unused_layer=true");
          cases.push_back(Case{2, "mlp", 160, 6, o});
        }
      }
    }
  }
  // The rest run on both single-host CPU backends: shm (what auto picks) and gloo.
  std::vector<Case> both;
  for (int k : {1, 2}) both.push_back(Case{2, "mlp", 160, 6, {"comm.reducer=flat", "train.accumulate_steps=" + std::to_string(k)}});
  both.push_back(Case{2, "mlp", 160, 12, {}});  // 10 steps per epoch: crosses an epoch boundary
  both.push_back(Case{4, "mlp", 150, 12, {}});  // 150 % 4 != 0: sampler pads; short last batch
  both.push_back(Case{4, "mlp", 192, 5, {"comm.gradient_as_bucket_view=true", tiny, "train.accumulate_steps=3"}});
  both.push_back(Case{4, "mlp", 150, 6, {"comm.reducer=flat"}});
  // Recipes: AdamW with decoupled weight decay, warm-up then cosine, clipping (the clipping bites:
  // the MLP's first gradients are larger than 0.5); Adam with a step schedule and accumulation;
  // Nesterov SGD with a linear decay.
  both.push_back(Case{2, "mlp", 160, 14, {"train.optimizer=adamw", "train.lr=0.01", "train.weight_decay=0.05",
                                          "train.lr_schedule=cosine", "train.warmup_steps=3", "train.min_lr=0.001",
                                          "train.clip_grad_norm=0.5"}});
  both.push_back(Case{2, "mlp", 160, 10, {"train.optimizer=adam", "train.lr=0.01", "train.betas=[0.8, 0.99]",
                                          "train.lr_schedule=step", "train.step_size=3", "train.gamma=0.5",
                                          "train.accumulate_steps=2"}});
  both.push_back(Case{2, "cnn", 64, 6, {"train.nesterov=true", "train.lr_schedule=linear", "train.warmup_steps=2",
                                        "train.clip_grad_norm=1.0"}});
  both.push_back(Case{2, "cnn", 64, 5, {}});
#if TORCH_VERSION_MAJOR >= 2
  // SGD as torch.optim.SGD(fused=True) (ddp::FusedSGD): the reference's LibTorch SGD within rounding.
  both.push_back(Case{2, "mlp", 160, 8, {"train.fused=true", "train.momentum=0.9", "train.weight_decay=0.01"}});
#endif
  both.push_back(Case{4, "cnn", 50, 3, {"comm.gradient_as_bucket_view=true"}});
  for (const char* bcast : {"true", "false"}) {
    for (int k : {1, 2}) {
      both.push_back(Case{2, "cnn_bn", 64, 3, {std::string("comm.broadcast_buffers=") + bcast,
                                                "train.accumulate_steps=" + std::to_string(k)}});
    }
  }
  both.push_back(Case{4, "cnn_bn", 64, 2, {"comm.broadcast_buffers=true", tiny}});
  // SyncBatchNorm: every rank's statistics are the whole batch's, so one process on the union of
  // the ranks' batches with plain BatchNorm is the reference (parameters and running statistics).
  both.push_back(Case{2, "cnn_sbn", 64, 3, {}});
  both.push_back(Case{4, "cnn_sbn", 64, 2, {tiny}});
  // fp16 on the wire: gradients carry ~2^-11 relative error, so the bar is looser.
  both.push_back(Case{2, "mlp", 160, 6, {"comm.compression=fp16"}, 2e-3});
  both.push_back(Case{2, "cnn", 64, 3, {"comm.compression=fp16", "comm.gradient_as_bucket_view=true"}, 2e-3});
  for (const auto& c : both) {
    cases.push_back(c);
    Case gloo = c;
    gloo.options.push_back("backend=gloo");
    cases.push_back(gloo);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Loopback, DdpEquivalence,
    ::testing::ValuesIn(allCases()),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::ostringstream name;
      name << info.param;
      return name.str();
    });

}  // namespace
}  // namespace ddp
