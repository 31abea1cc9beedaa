// output.tensorboard (issue 13 item 6): rank 0's event files, read back with TensorBoard's own
// Python reader (PyPI tensorboard, pinned in scripts/requirements.txt), hold the same scalars as
// metrics.jsonl and summary.json.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

TEST(TensorBoard, ScalarsReadBackWithTensorBoardsReader) {
  const std::string dir = test::makeTempDir("tensorboard");
  const auto run = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN,
                                     std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml", "output.dir=" + dir,
                                     "output.tensorboard=true", "train.max_steps=30", "train.log_every=10",
                                     "train.lr=0.125"},
                                    300);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto read = test::runCommand(
      {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/read_tensorboard.py", dir + "/tensorboard"}, 120);
  ASSERT_EQ(read.exitCode, 0) << read.output;
  nlohmann::json board;
  ASSERT_NO_THROW(board = nlohmann::json::parse(read.output.substr(read.output.find('{')))) << read.output;

  // Rank 0 alone writes: one file, named as TensorBoard expects.
  ASSERT_EQ(board["_files"].size(), 1u) << board.dump();
  EXPECT_EQ(board["_files"][0].get<std::string>().rfind("events.out.tfevents.", 0), 0u);

  // Every metrics.jsonl record is a point of train/loss and train/samples_per_s (float32 in the file).
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(metrics, line);) records.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(records.size(), 4u);  // steps 1, 10, 20, 30
  ASSERT_EQ(board["train/loss"].size(), records.size()) << board.dump();
  ASSERT_EQ(board["train/samples_per_s"].size(), records.size()) << board.dump();
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(board["train/loss"][i][0], records[i]["step"]);
    const double loss = records[i]["loss"];
    EXPECT_NEAR(board["train/loss"][i][1].get<double>(), loss, 1e-6 * std::abs(loss));
    const double rate = records[i]["samples_per_s"];
    EXPECT_NEAR(board["train/samples_per_s"][i][1].get<double>(), rate, 1e-6 * rate);
    EXPECT_EQ(board["train/lr"][i][1].get<double>(), 0.125);
  }
  // The test accuracy once, at the last step.
  const auto summary = nlohmann::json::parse(test::readFile(dir + "/summary.json"));
  ASSERT_EQ(board["test/accuracy"].size(), 1u);
  EXPECT_EQ(board["test/accuracy"][0][0], summary["steps"]);
  EXPECT_NEAR(board["test/accuracy"][0][1].get<double>(), summary["test_accuracy"].get<double>(), 1e-6);
}

TEST(TensorBoard, OffByDefault) {
  const std::string dir = test::makeTempDir("tensorboard_off");
  const auto run = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN,
                                     std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml", "output.dir=" + dir,
                                     "train.max_steps=3"},
                                    300);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_TRUE(fs::exists(dir + "/summary.json"));
  EXPECT_FALSE(fs::exists(dir + "/tensorboard"));
}

}  // namespace
}  // namespace ddp
