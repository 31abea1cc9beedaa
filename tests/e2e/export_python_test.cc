// The rank-0 export of a real 2-rank DDP run on Fashion-MNIST loads with
// Python PyTorch's plain torch.load(path) (weights_only=True by default since
// 2.6; check_export.py asserts it) into the equivalent Python module with
// load_state_dict(strict=True), and Python's test accuracy equals the one the
// worker reported.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "tests/support/run_command.h"

namespace ddp {
namespace {

struct ExportCase {
  std::string model;
  std::string hidden;
};

class ExportLoadsInPython : public ::testing::TestWithParam<ExportCase> {};

TEST_P(ExportLoadsInPython, StrictKeysAndSameAccuracy) {
  const ExportCase c = GetParam();
  const char* root = std::getenv("DDP_FASHION_MNIST_ROOT");
  const std::string dataRoot = root ? root : "/usr/share/datasets/fashion-mnist";
  std::string tmpl = (std::filesystem::temp_directory_path() / "ddp_export_XXXXXX").string();
  const std::string dir = ::mkdtemp(tmpl.data());

  const auto run = test::runCommand(
      {DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN,
       std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml", "model.name=" + c.model,
       "model.hidden=[" + c.hidden + "]", "data.root=" + dataRoot, "train.max_steps=60",
       "train.batch_size=32", "output.dir=" + dir},
      600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto summary = nlohmann::json::parse(test::readFile(dir + "/summary.json"));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["steps"], 60);
  EXPECT_EQ(summary["test_total"], 10000);
  // 60 steps of 64 samples already learn a lot: far above chance (10%).
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.6);
  // The evaluation's wall time is reported, and it is a part of the run, not all of it.
  EXPECT_GT(summary["eval_seconds"].get<double>(), 0.0);
  EXPECT_LT(summary["eval_seconds"].get<double>(), 600.0);

  const std::string out = test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/check_export.py",
                                            dir + "/model.pt", c.model, c.hidden, dataRoot},
                                           test::CommandOptions())
                              .output;
  nlohmann::json py;
  ASSERT_NO_THROW(py = nlohmann::json::parse(out)) << out;
  EXPECT_EQ(py["total"], 10000);
  // Same weights, same data, same kernels: at most a rounding-level tie may flip.
  EXPECT_NEAR(py["correct"].get<int64_t>(), summary["test_correct"].get<int64_t>(), 2)
      << "python " << py["correct"] << " vs worker " << summary["test_correct"];
  for (const auto& key : py["keys"]) {
    EXPECT_EQ(key.get<std::string>().rfind("module.", 0), std::string::npos) << key;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(FashionMnist, ExportLoadsInPython,
                         ::testing::Values(ExportCase{"cnn", "512,256"}, ExportCase{"mlp", "512,256"}),
                         [](const auto& info) { return info.param.model; });

}  // namespace
}  // namespace ddp
