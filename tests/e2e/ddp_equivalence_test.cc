// Tier 3: real worker processes started by the real ddp-launch over loopback
// Gloo. After K steps every rank must hold identical parameters, equal (1e-5)
// to a plain single-process LibTorch run on the concatenated per-rank batches.
#include <gtest/gtest.h>

#include <ATen/ops/cat.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdlib>
#include <filesystem>

#include "sampler/batching.h"
#include "sampler/distributed_sampler.h"
#include "tests/e2e/run_command.h"
#include "worker/config.h"
#include "worker/data/gather_batch.h"
#include "worker/model_export.h"
#include "worker/models.h"
#include "worker/trainer.h"

namespace ddp {
namespace {

using worker::WorkerConfig;

std::string makeTempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("ddp_" + tag + "_XXXXXX")).string();
  return ::mkdtemp(tmpl.data());
}

/// The reference: one process, one model, the union of every rank's batch per
/// step (rank order), plain torch::optim::SGD. No communication involved.
std::map<std::string, at::Tensor> referenceRun(const WorkerConfig& config, int world) {
  const worker::Datasets data = worker::loadDatasets(config.data, config.seed);
  torch::manual_seed(config.seed);
  auto model = worker::makeModel(config.model, data.input);
  torch::optim::SGD sgd(model.ptr()->parameters(),
                        torch::optim::SGDOptions(config.train.lr).momentum(config.train.momentum));
  std::vector<sampler::DistributedSampler> samplers;
  for (int r = 0; r < world; ++r) {
    sampler::DistributedSamplerOptions o;
    o.numReplicas = world;
    o.rank = r;
    o.seed = config.seed;
    o.shuffle = config.train.shuffle;
    samplers.emplace_back(data.train.size(), o);
  }
  int64_t steps = 0;
  for (int64_t epoch = 0; steps < config.train.maxSteps; ++epoch) {
    std::vector<std::vector<std::vector<int64_t>>> perRank;
    for (auto& s : samplers) {
      s.setEpoch(epoch);
      perRank.push_back(sampler::makeBatches(s.indices(), config.train.batchSize, false));
    }
    for (std::size_t b = 0; b < perRank[0].size() && steps < config.train.maxSteps; ++b, ++steps) {
      std::vector<int64_t> all;
      for (int r = 0; r < world; ++r) all.insert(all.end(), perRank[r][b].begin(), perRank[r][b].end());
      const auto batch = data::gatherBatch(data.train, all);
      sgd.zero_grad();
      torch::nn::functional::cross_entropy(model.forward(batch.images), batch.labels).backward();
      sgd.step();
    }
  }
  return worker::stateDict(*model.ptr());
}

struct Case {
  int world;
  std::string model;
  int64_t trainSize;
  int64_t maxSteps;
};

std::ostream& operator<<(std::ostream& out, const Case& c) {
  return out << c.world << "ranks_" << c.model << "_n" << c.trainSize << "_k" << c.maxSteps;
}

class DdpEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(DdpEquivalence, RanksAgreeAndMatchSingleProcessOnConcatenatedBatches) {
  const Case c = GetParam();
  const std::string dir = makeTempDir("equiv");
  const std::vector<std::string> overrides = {
      "mode=ddp", "seed=3", "model.name=" + c.model, "model.hidden=[32]",
      "data.name=synthetic", "data.synthetic_train=" + std::to_string(c.trainSize),
      "data.synthetic_test=64", "train.batch_size=8", "train.lr=0.1", "train.momentum=0.9",
      "train.epochs=100", "train.max_steps=" + std::to_string(c.maxSteps),
      "output.dir=" + dir, "output.dump_rank_params=true"};
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(c.world),
                                   DDP_WORKER_BIN, std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml"};
  argv.insert(argv.end(), overrides.begin(), overrides.end());
  const auto run = test::runCommand(argv, 240);
  ASSERT_EQ(run.exitCode, 0) << run.output;

  const WorkerConfig config =
      worker::loadConfig(std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml", overrides);
  const auto expected = referenceRun(config, c.world);
  const auto rank0 = worker::readStateDict(dir + "/rank0_params.pt");
  ASSERT_EQ(rank0.size(), expected.size());
  for (int r = 1; r < c.world; ++r) {
    const auto other = worker::readStateDict(dir + "/rank" + std::to_string(r) + "_params.pt");
    for (const auto& [key, value] : rank0) {
      EXPECT_TRUE(at::equal(value, other.at(key))) << "rank " << r << " differs from rank 0 in " << key;
    }
  }
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(rank0.count(key)) << key;
    const double diff = (rank0.at(key) - value).abs().max().item<double>();
    EXPECT_LT(diff, 1e-5) << key << " differs from the single-process reference by " << diff;
  }
  // The export is rank 0's parameters under plain keys.
  const auto exported = worker::readStateDict(dir + "/model.pt");
  for (const auto& [key, value] : rank0) EXPECT_TRUE(at::equal(value, exported.at(key))) << key;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Loopback, DdpEquivalence,
    ::testing::Values(Case{2, "mlp", 160, 12},   // 10 steps per epoch: crosses an epoch boundary
                      Case{4, "mlp", 150, 12},   // 150 % 4 != 0: sampler pads; short last batch
                      Case{2, "cnn", 64, 5},
                      Case{4, "cnn", 50, 3}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::ostringstream name;
      name << info.param;
      return name.str();
    });

}  // namespace
}  // namespace ddp
