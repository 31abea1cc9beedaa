// Tier 3: the worker in mode dp through the real ddp-launch. One process is
// accepted, two are refused with a clear line; a whole dp run ends with the
// parameters of a plain single-process LibTorch run on the same batches; its
// export has the plain model's keys and loads in Python with strict keys.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <ATen/ops/equal.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/training_checkpoint.h"
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

const std::string kConfig = std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml";

test::CommandResult launch(int nproc, const std::vector<std::string>& overrides) {
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(nproc),
                                   DDP_WORKER_BIN, kConfig};
  argv.insert(argv.end(), overrides.begin(), overrides.end());
  return test::runCommand(argv, 240);
}

/// The reference: one process, one plain model, every batch of the one-replica
/// sampler whole (the short last one too), torch::optim::SGD. No DataParallel.
std::map<std::string, at::Tensor> referenceRun(const worker::WorkerConfig& config) {
  const worker::Datasets data = worker::loadDatasets(config.data, config.seed);
  torch::manual_seed(config.seed);
  auto model = worker::makeModel(config.model, data.input);
  torch::optim::SGD sgd(model.ptr()->parameters(),
                        torch::optim::SGDOptions(config.train.lr).momentum(config.train.momentum));
  sampler::DistributedSamplerOptions o;
  o.numReplicas = 1;
  o.rank = 0;
  o.seed = config.seed;
  o.shuffle = config.train.shuffle;
  sampler::DistributedSampler sampler(data.train.size(), o);
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < config.train.epochs; ++epoch) {
    sampler.setEpoch(epoch);
    for (const auto& indices : sampler::makeBatches(sampler.indices(), config.train.batchSize, false)) {
      const auto batch = worker::data::gatherBatch(data.train, indices);
      sgd.zero_grad();
      torch::nn::functional::cross_entropy(model.forward(batch.images), batch.labels).backward();
      sgd.step();
      ++steps;
    }
  }
  EXPECT_EQ(steps, config.train.epochs * ((data.train.size() + config.train.batchSize - 1) / config.train.batchSize));
  return ddp::stateDict(*model.ptr());
}

TEST(DpWorker, TwoProcessesAreRefusedWithAClearLine) {
  const std::string dir = test::makeTempDir("dp_refused");
  const auto run = launch(2, {"mode=dp", "output.dir=" + dir});
  EXPECT_EQ(run.exitCode, 2) << run.output;
  EXPECT_NE(run.output.find("mode 'dp'"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("WORLD_SIZE=2"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("--nproc_per_node=1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("mode: ddp"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("ddp-launch: rank"), std::string::npos) << "the launcher reports it: " << run.output;
  // Printed by the host's first rank only (every rank refuses alike), not once per rank.
  EXPECT_EQ(run.output.find("[rank 1] worker: config: mode 'dp'"), std::string::npos) << run.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.pt"));
  std::filesystem::remove_all(dir);
}

// Preemption in mode dp as in ddp (worker.md "Preemption"): SIGTERM to the launcher finishes the
// step, saves a checkpoint, exits 143; resumed, the run ends where an uninterrupted one does, bit
// for bit. (dp installed no handler: the signal killed it, no checkpoint, all its training lost.)
TEST(DpWorker, SigtermSavesACheckpointAndTheResumedRunIsTheUninterruptedOne) {
  const std::string dir = test::makeTempDir("dp_sigterm");
  auto args = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> a = {DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN, kConfig,
                                  "mode=dp", "dp.replicas=2", "seed=5", "model.hidden=[32]",
                                  "data.synthetic_train=200", "data.synthetic_test=64", "train.batch_size=16",
                                  "train.lr=0.05", "train.momentum=0.9", "train.log_every=1",
                                  "checkpoint.every_steps=0", "output.dir=" + dir + "/" + name};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const test::SignalledRun stopped = test::runSignalledAt(args("stopped", {"train.epochs=100000"}), "step 15/", SIGTERM);
  ASSERT_TRUE(stopped.signalled) << "the job ended before step 15:\n" << stopped.output;
  ASSERT_TRUE(WIFEXITED(stopped.status)) << stopped.output;
  EXPECT_EQ(WEXITSTATUS(stopped.status), 128 + SIGTERM) << stopped.output;
  ASSERT_NE(stopped.output.find("stopping after step"), std::string::npos) << stopped.output;
  const auto saved = checkpoint::latestValidCheckpoint(dir + "/stopped/checkpoints", nullptr);
  ASSERT_TRUE(saved.has_value()) << stopped.output;
  const int64_t step = checkpoint::loadTrainingCheckpoint(*saved).globalStep;
  EXPECT_GE(step, 15);

  const std::string target = "train.max_steps=" + std::to_string(step + 7);
  const auto resumed = test::runCommand(args("stopped", {"train.epochs=100000", target, "resume=auto"}), 240);
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + *saved), std::string::npos) << resumed.output;
  const auto straight = test::runCommand(args("straight", {"train.epochs=100000", target}), 240);
  ASSERT_EQ(straight.exitCode, 0) << straight.output;
  const auto a = ddp::loadTensors(dir + "/stopped/model.pt");
  const auto b = ddp::loadTensors(dir + "/straight/model.pt");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, value] : b) {
    ASSERT_TRUE(a.count(key)) << key;
    EXPECT_TRUE(torch::equal(a.at(key), value)) << key << " differs from the uninterrupted run's";
  }
  std::filesystem::remove_all(dir);
}

struct RunCase {
  std::string model;
  int replicas;
  int64_t trainSize;   // with batch 16: the last batch is trainSize % 16
  int64_t epochs;
};

std::ostream& operator<<(std::ostream& out, const RunCase& c) {
  return out << c.model << "_r" << c.replicas << "_n" << c.trainSize << "_e" << c.epochs;
}

class DpWorkerRun : public ::testing::TestWithParam<RunCase> {};

TEST_P(DpWorkerRun, OneProcessMatchesPlainSingleProcessTraining) {
  const RunCase c = GetParam();
  const std::string dir = test::makeTempDir("dp_run");
  const std::vector<std::string> overrides = {
      "mode=dp", "seed=5", "model.name=" + c.model, "model.hidden=[32]", "data.name=synthetic",
      "data.synthetic_train=" + std::to_string(c.trainSize), "data.synthetic_test=200",
      "train.batch_size=16", "train.lr=0.1", "train.momentum=0.9",
      "train.epochs=" + std::to_string(c.epochs), "train.log_every=5",
      "dp.replicas=" + std::to_string(c.replicas), "output.dir=" + dir};
  const auto run = launch(1, overrides);
  ASSERT_EQ(run.exitCode, 0) << run.output;

  const auto summary = nlohmann::json::parse(test::readFile(dir + "/summary.json"));
  EXPECT_EQ(summary["mode"], "dp");
  EXPECT_EQ(summary["world_size"], 1);
  EXPECT_EQ(summary["dp_replicas"], c.replicas);
  EXPECT_EQ(summary["samples"], c.trainSize * c.epochs);
  EXPECT_EQ(summary["test_total"], 200);
  EXPECT_GT(summary["peak_rss_mb"].get<double>(), 10.0);
  EXPECT_FALSE(test::readFile(dir + "/metrics.jsonl").empty());

  const worker::WorkerConfig config = worker::loadConfig(kConfig, overrides);
  const auto expected = referenceRun(config);
  const auto exported = ddp::loadTensors(dir + "/model.pt");
  ASSERT_EQ(exported.size(), expected.size());
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(exported.count(key)) << "export lacks the plain model's key " << key;
    const double diff = (exported.at(key) - value).abs().max().item<double>();
    EXPECT_LT(diff, 1e-5) << key << " differs from the single-process reference by " << diff;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Synthetic, DpWorkerRun,
    ::testing::Values(RunCase{"mlp", 3, 146, 2},   // last batch of 2 < 3 replicas, across an epoch boundary
                      RunCase{"mlp", 4, 90, 1},    // 16 over 4, last batch 10 over 4: uneven
                      RunCase{"cnn", 2, 41, 1}),   // last batch of 9: uneven over 2
    [](const auto& info) {
      return info.param.model + "_r" + std::to_string(info.param.replicas) + "_n" +
             std::to_string(info.param.trainSize);
    });

// The export of a dp run on Fashion-MNIST: the plain model's keys, strict load
// in Python, and Python's test accuracy equals the worker's.
TEST(DpWorker, ExportLoadsIntoThePlainModelAndPythonWithStrictKeys) {
  const char* root = std::getenv("DDP_FASHION_MNIST_ROOT");
  const std::string dataRoot = root ? root : "/usr/share/datasets/fashion-mnist";
  const std::string dir = test::makeTempDir("dp_export");
  const auto run = test::runCommand(
      {DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN,
       std::string(DDP_SOURCE_DIR) + "/configs/fmnist_mlp_ddp.yaml", "mode=dp", "dp.replicas=3",
       "model.hidden=[64]", "data.root=" + dataRoot, "train.max_steps=40", "train.batch_size=64",
       "output.dir=" + dir},
      300);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto summary = nlohmann::json::parse(test::readFile(dir + "/summary.json"));
  EXPECT_EQ(summary["steps"], 40);
  EXPECT_EQ(summary["test_total"], 10000);
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.6);  // chance is 0.1
  EXPECT_GT(summary["eval_seconds"].get<double>(), 0.0);

  worker::ModelConfig plain;
  plain.name = "mlp";
  plain.hidden = {64};
  const auto plainKeys = ddp::stateDict(*worker::makeModel(plain, worker::InputSpec{}).ptr());
  const auto exported = ddp::loadTensors(dir + "/model.pt");
  ASSERT_EQ(exported.size(), plainKeys.size());
  for (const auto& [key, value] : plainKeys) {
    ASSERT_TRUE(exported.count(key)) << key;
    EXPECT_EQ(exported.at(key).sizes(), value.sizes()) << key;
  }

  const std::string out = test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/check_export.py",
                                            dir + "/model.pt", "mlp", "64", dataRoot},
                                           test::CommandOptions())
                              .output;
  nlohmann::json py;
  ASSERT_NO_THROW(py = nlohmann::json::parse(out)) << out;
  EXPECT_EQ(py["total"], 10000);
  EXPECT_NEAR(py["correct"].get<int64_t>(), summary["test_correct"].get<int64_t>(), 2);
  for (const auto& key : py["keys"]) EXPECT_EQ(key.get<std::string>().rfind("module.", 0), std::string::npos) << key;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
