// Issue 44 item 4 through the real programs: train.sharding none | zero1 | zero2 | full. The
// reference of `full` and `zero2` (ddp::fullyShard: the GPT's blocks, the CNN's layers, then the
// root; zero2 keeping the whole parameters) is the same job with `none` (DDP, whose parity with
// PyTorch is tested elsewhere): the exported weights within 1e-5 in fp32, with AdamW's two
// weight-decay groups, SGD, clipping by the global norm and accumulation; summary.json's bytes per
// rank from the shapes (FSDP2's padding); misuse as one line, exit 2.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/state_dict.h"
#include "tests/support/e2e_models.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

// Char-level shards of docs/*.md, made once per test program (as e2e_language_model's).
const std::string& corpus() { return test::docsCharCorpus("sharding_corpus"); }

std::string fashionMnistRoot() {
  const char* root = std::getenv("DDP_FASHION_MNIST_ROOT");
  return root ? root : "/usr/share/datasets/fashion-mnist";
}

std::vector<std::string> launch(int nproc, const std::string& config, const std::string& out,
                                const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(nproc), DDP_WORKER_BIN,
                                   std::string(DDP_SOURCE_DIR) + "/configs/" + config, "output.dir=" + out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// A 2-layer GPT (2 heads, 32 wide, windows of 32) on the corpus, 6 steps.
std::vector<std::string> gptJob(int nproc, const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> argv = {"model.name=gpt", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
                                   "model.block_size=32", "data.name=tokens",
                                   "data.train_files=" + corpus() + "/train_*.bin",
                                   "data.val_files=" + corpus() + "/val_*.bin", "train.batch_size=4",
                                   "train.max_steps=6", "eval.iters=4", "backend=shm"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return launch(nproc, "synthetic_mlp.yaml", out, argv);
}

// The Fashion-MNIST CNN, 6 steps of SGD with momentum and weight decay.
std::vector<std::string> cnnJob(int nproc, const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> argv = {"data.root=" + fashionMnistRoot(), "device=cpu", "train.batch_size=16",
                                   "train.max_steps=6", "train.weight_decay=0.01"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return launch(nproc, "fmnist_cnn_ddp.yaml", out, argv);
}

struct Job {
  StateDict exported;
  nlohmann::json summary;
  std::string output;
};

Job run(const std::vector<std::string>& argv, const std::string& out) {
  const auto r = test::runCommand(argv, 120);
  EXPECT_EQ(r.exitCode, 0) << r.output;
  Job job;
  job.output = r.output;
  if (r.exitCode != 0) return job;
  job.exported = loadTensors(out + "/model.pt");
  job.summary = nlohmann::json::parse(test::readFile(out + "/summary.json"));
  fs::remove_all(out);
  return job;
}


constexpr double kMiB = 1024.0 * 1024.0;

// The fp32 parameters' MB as DDP keeps them (each whole) and as `world` ranks of full sharding
// keep them: every parameter's dim 0 cut in `world` chunks of ceil(dim0 / world) rows (FSDP2's
// padding), from the export's shapes (the tied lm_head.weight is wte's, counted once).
std::pair<double, double> parameterMb(const StateDict& exported, int world) {
  int64_t whole = 0, shard = 0;
  for (const auto& [key, t] : exported) {
    if (key == "lm_head.weight") continue;
    const int64_t rows = t.size(0), row = t.numel() / rows;
    whole += t.numel() * 4;
    shard += (rows + world - 1) / world * row * 4;
  }
  return {static_cast<double>(whole) / kMiB, static_cast<double>(shard) / kMiB};
}

std::vector<double> perRank(const nlohmann::json& summary, const std::string& key) {
  return summary[key].get<std::vector<double>>();
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// AdamW with nanoGPT's two groups (decay on matrices only), clipping to 0.5 (the gradients' norm is
// above it: clipping acts), two micro-batches per step; zero2 as well, and zero1 beside them for the
// bytes.
TEST(Sharding, GptFullAndZero2EqualDdpWithAdamWGroupsClippingAndAccumulation) {
  const std::vector<std::string> recipe = {"train.optimizer=adamw", "train.lr=0.003", "train.weight_decay=0.1",
                                           "train.clip_grad_norm=0.5", "train.accumulate_steps=2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), recipe.begin(), recipe.end());
    return extra;
  };
  const std::string base = test::makeTempDir("sharding_gpt");
  const Job none = run(gptJob(2, base + "/none", with({})), base + "/none");
  const Job zero1 = run(gptJob(2, base + "/zero1", with({"train.sharding=zero1"})), base + "/zero1");
  const Job full = run(gptJob(2, base + "/full", with({"train.sharding=full"})), base + "/full");
  const Job zero2 = run(gptJob(2, base + "/zero2", with({"train.sharding=zero2"})), base + "/zero2");
  fs::remove_all(base);
  ASSERT_FALSE(none.exported.empty() || zero1.exported.empty() || full.exported.empty() || zero2.exported.empty());
  // Each block a unit, then the root; 30 048 parameters, of which rank 0 holds its padded shards.
  const auto [wholeMb, shardMb] = parameterMb(none.exported, 2);
  const std::string units = "train.sharding full: 3 units (2 of the model's, then the root); rank 0 holds " +
                            std::to_string(static_cast<int64_t>(shardMb * kMiB / 4)) + " of the " +
                            std::to_string(static_cast<int64_t>(wholeMb * kMiB / 4)) + " parameters";
  EXPECT_NE(full.output.find(units), std::string::npos) << units << " not in:\n" << full.output;
  const std::string zero2Units = "train.sharding zero2: 3 units" + units.substr(units.find(" ("));
  EXPECT_NE(zero2.output.find(zero2Units), std::string::npos) << zero2Units << " not in:\n" << zero2.output;
  // nanoGPT's keys, the head tied, the same weights.
  ASSERT_EQ(full.exported.count("lm_head.weight"), 1u);
  EXPECT_TRUE(full.exported.at("lm_head.weight").equal(full.exported.at("transformer.wte.weight")));
  EXPECT_LE(test::maxStateDifference(none.exported, full.exported), 1e-5);
  EXPECT_LE(test::maxStateDifference(none.exported, zero1.exported), 1e-5);
  EXPECT_LE(test::maxStateDifference(none.exported, zero2.exported), 1e-5);
  ASSERT_EQ(zero2.exported.count("lm_head.weight"), 1u);
  for (const Job* job : {&full, &zero2}) {
    EXPECT_NEAR(job->summary["val_loss"].get<double>(), none.summary["val_loss"].get<double>(), 1e-5);
    EXPECT_NEAR(job->summary["final_loss"].get<double>(), none.summary["final_loss"].get<double>(), 1e-5);
  }

  EXPECT_EQ(none.summary["sharding"], "none");
  EXPECT_EQ(zero1.summary["sharding"], "zero1");
  EXPECT_EQ(zero1.summary["zero"], true);  // train.zero's alias
  EXPECT_EQ(full.summary["sharding"], "full");
  EXPECT_EQ(zero2.summary["sharding"], "zero2");
  EXPECT_LT(shardMb, 0.51 * wholeMb);
  for (int r = 0; r < 2; ++r) {
    // none and zero1 keep every parameter and gradient; full its padded shards of both.
    EXPECT_DOUBLE_EQ(perRank(none.summary, "parameter_mb_per_process")[r], wholeMb);
    EXPECT_DOUBLE_EQ(perRank(none.summary, "gradient_mb_per_process")[r], wholeMb);
    EXPECT_DOUBLE_EQ(perRank(zero1.summary, "parameter_mb_per_process")[r], wholeMb);
    EXPECT_DOUBLE_EQ(perRank(full.summary, "parameter_mb_per_process")[r], shardMb);
    EXPECT_DOUBLE_EQ(perRank(full.summary, "gradient_mb_per_process")[r], shardMb);
    // zero2: the whole parameters (padded: the 2 ranks' shards side by side; the shards are their
    // rows), the gradients sharded.
    EXPECT_DOUBLE_EQ(perRank(zero2.summary, "parameter_mb_per_process")[r], 2 * shardMb);
    EXPECT_DOUBLE_EQ(perRank(zero2.summary, "gradient_mb_per_process")[r], shardMb);
    EXPECT_LT(perRank(zero2.summary, "optimizer_state_mb_per_process")[r], 1.01 * wholeMb);
    // AdamW's two moments: whole under none, a share under zero1 and full.
    EXPECT_DOUBLE_EQ(perRank(none.summary, "optimizer_state_mb_per_process")[r], 2 * wholeMb);
    EXPECT_LT(perRank(full.summary, "optimizer_state_mb_per_process")[r], 1.01 * wholeMb);
    EXPECT_GT(perRank(full.summary, "peak_rss_mb_per_process")[r], 0);
  }
  // The shards of the moments (unpadded) partition DDP's.
  EXPECT_DOUBLE_EQ(sum(perRank(full.summary, "optimizer_state_mb_per_process")), 2 * wholeMb);
  EXPECT_DOUBLE_EQ(sum(perRank(zero2.summary, "optimizer_state_mb_per_process")), 2 * wholeMb);
  EXPECT_DOUBLE_EQ(sum(perRank(zero1.summary, "optimizer_state_mb_per_process")), 2 * wholeMb);
}

// SGD under bf16 autocast: the gathered fp32 parameters compute as DDP's replicas do.
TEST(Sharding, GptFullEqualsDdpWithSgdUnderBf16Autocast) {
  const std::vector<std::string> recipe = {"train.optimizer=sgd", "train.lr=0.1", "train.precision=bf16"};
  const std::string base = test::makeTempDir("sharding_bf16");
  std::vector<std::string> withFull = recipe;
  withFull.push_back("train.sharding=full");
  const Job none = run(gptJob(2, base + "/none", recipe), base + "/none");
  const Job full = run(gptJob(2, base + "/full", withFull), base + "/full");
  fs::remove_all(base);
  ASSERT_FALSE(none.exported.empty() || full.exported.empty());
  EXPECT_LE(test::maxStateDifference(none.exported, full.exported), 1e-5);
  EXPECT_EQ(full.exported.at("transformer.wte.weight").scalar_type(), at::kFloat);  // fp32 master weights
}

// The CNN per layer: 2 ranks over shm (clipping, accumulation), then 3 over Gloo, where the shards
// are uneven (conv1's 32 rows: 11, 11, 10) and so are the test set's slices in batches (3333,
// 3333, 3334 images in batches of 1111: 3, 3 and 4 forwards, which the sharded model needs on
// every rank): the same weights and the same test accuracy as DDP; zero2 as well.
TEST(Sharding, CnnFullAndZero2EqualDdpOnTwoAndThreeRanks) {
  if (!fs::exists(fashionMnistRoot() + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Debian package dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  }
  const std::string base = test::makeTempDir("sharding_cnn");
  const std::vector<std::string> two = {"backend=shm", "train.clip_grad_norm=1.0", "train.accumulate_steps=2",
                                        "eval.enabled=false"};
  const std::vector<std::string> three = {"backend=gloo", "eval.batch_size=1111"};
  auto plus = [](std::vector<std::string> v, const std::string& more) {
    v.push_back(more);
    return v;
  };
  const Job none2 = run(cnnJob(2, base + "/n2", two), base + "/n2");
  const Job full2 = run(cnnJob(2, base + "/f2", plus(two, "train.sharding=full")), base + "/f2");
  const Job none3 = run(cnnJob(3, base + "/n3", three), base + "/n3");
  const Job full3 = run(cnnJob(3, base + "/f3", plus(three, "train.sharding=full")), base + "/f3");
  const Job zero22 = run(cnnJob(2, base + "/z2", plus(two, "train.sharding=zero2")), base + "/z2");
  const Job zero23 = run(cnnJob(3, base + "/z3", plus(three, "train.sharding=zero2")), base + "/z3");
  fs::remove_all(base);
  ASSERT_FALSE(none2.exported.empty() || full2.exported.empty() || none3.exported.empty() || full3.exported.empty() ||
               zero22.exported.empty() || zero23.exported.empty());
  EXPECT_LE(test::maxStateDifference(none2.exported, full2.exported), 1e-5);
  EXPECT_LE(test::maxStateDifference(none3.exported, full3.exported), 1e-5);
  EXPECT_LE(test::maxStateDifference(none2.exported, zero22.exported), 1e-5);
  EXPECT_LE(test::maxStateDifference(none3.exported, zero23.exported), 1e-5);
  EXPECT_EQ(full3.summary["test_total"], 10000);
  EXPECT_EQ(full3.summary["test_correct"], none3.summary["test_correct"]);
  EXPECT_EQ(zero23.summary["test_correct"], none3.summary["test_correct"]);
  for (const auto& [job, world] : {std::pair<const Job*, int>{&full2, 2}, {&full3, 3}}) {
    const double shardMb = parameterMb(none3.exported, world).second;
    for (int r = 0; r < world; ++r) {
      EXPECT_DOUBLE_EQ(perRank(job->summary, "parameter_mb_per_process")[r], shardMb) << "world " << world;
    }
  }
  // zero2: the whole parameters (padded), of which the shards are rows.
  for (const auto& [job, world] : {std::pair<const Job*, int>{&zero22, 2}, {&zero23, 3}}) {
    const double shardMb = parameterMb(none3.exported, world).second;
    for (int r = 0; r < world; ++r) {
      EXPECT_DOUBLE_EQ(perRank(job->summary, "parameter_mb_per_process")[r], world * shardMb) << "world " << world;
      EXPECT_DOUBLE_EQ(perRank(job->summary, "gradient_mb_per_process")[r], shardMb) << "world " << world;
    }
  }
  EXPECT_DOUBLE_EQ(perRank(none3.summary, "parameter_mb_per_process")[2], parameterMb(none3.exported, 3).first);
}

struct Misuse {
  std::string name;
  std::vector<std::string> extra;
  std::string expected;
};

class ShardingMisuse : public ::testing::TestWithParam<Misuse> {};

TEST_P(ShardingMisuse, OneLineExitTwo) {
  const Misuse c = GetParam();
  const std::string out = test::makeTempDir("sharding_bad");
  const auto r = test::runCommand(launch(1, "synthetic_mlp.yaml", out + "/out", c.extra), 60);
  EXPECT_EQ(r.exitCode, 2) << r.output;
  EXPECT_NE(r.output.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in:\n" << r.output;
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/out/model.pt"));
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(
    Table, ShardingMisuse,
    ::testing::Values(
        Misuse{"UnknownValue", {"train.sharding=zero3"}, "'train.sharding' is 'zero3'; use none, zero1, zero2 or full"},
        Misuse{"ZeroAliasDisagrees", {"train.zero=true", "train.sharding=full"},
               "'train.zero' is true but 'train.sharding' is full; train.zero: true is train.sharding: zero1"},
        Misuse{"ModeDp", {"train.sharding=full", "mode=dp"}, "mode dp keeps whole replicas on threads; use mode ddp"},
        Misuse{"Zero2ModeDp", {"train.sharding=zero2", "mode=dp"}, "'train.sharding' is zero2, which shards over"},
        Misuse{"CudaGraph", {"train.sharding=full", "train.cuda_graph=true"}, "set train.cuda_graph: false"},
        Misuse{"CommHook", {"train.sharding=full", "comm.hook=fp16"}, "without DDP's communication hooks"},
        Misuse{"Compression", {"train.sharding=full", "comm.compression=bf16"}, "comm.compression: none"},
        Misuse{"SyncBatchNorm", {"train.sharding=full", "model.name=cnn", "model.batch_norm=true",
                                 "model.sync_batch_norm=true"},
               "does not run with model.sync_batch_norm yet"},
        Misuse{"TorchScript", {"train.sharding=full", "model.name=torchscript", "model.path=/nonexistent.pt"},
               "a TorchScript model's forward cannot run its layers as sharded units"},
        Misuse{"Join", {"train.sharding=full", "train.uneven_inputs=join"}, "set train.uneven_inputs: pad"}),
    [](const ::testing::TestParamInfo<Misuse>& info) { return info.param.name; });

}  // namespace
}  // namespace ddp
