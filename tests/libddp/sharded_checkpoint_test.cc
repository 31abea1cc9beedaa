// Sharded training checkpoints of ddp::fullyShard models (ddp::Checkpointer): each run is
// sharded_checkpoint_program under ddp-launch (real processes, shm). Resume at the same world size
// is bitwise; a reshard at another world size loads exactly the saved values (its re-save
// consolidates to the same bytes) and training goes on as an unbroken run within float rounding;
// a DDP run's one-file checkpoint starts a sharded run and a sharded one a DDP run; a damaged or
// foreign checkpoint fails every rank with one line.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/checkpoint.h"
#include "ddp/state_dict.h"
#include "libddp/checkpoint/training_checkpoint.h"
#include "tests/support/run_command.h"

namespace {
namespace fs = std::filesystem;
using ddp::test::runCommand;

class ShardedCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = ddp::test::makeTempDir("sharded_checkpoint_test"); }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // ddp-launch --nproc_per_node=<world> sharded_checkpoint_program <args>; the output on failure.
  static ddp::test::CommandResult launch(int world, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {DDP_LAUNCH, "--nproc_per_node=" + std::to_string(world), PROGRAM};
    argv.insert(argv.end(), args.begin(), args.end());
    ddp::test::CommandOptions options;
    options.timeoutSeconds = 120;
    options.extraEnv = {"DDP_TEST_BACKEND=shm"};
    return runCommand(argv, options);
  }
  static void launchOk(int world, const std::vector<std::string>& args) {
    const auto r = launch(world, args);
    ASSERT_EQ(r.exitCode, 0) << r.output;
  }
  static std::string path(const std::string& name) { return (fs::path(dir_) / name).string(); }

  // A straight run of `mode` at `world` ranks and its export (once per configuration).
  static std::string straight(const std::string& mode, int world, const std::string& optimizer) {
    const std::string out = path("straight_" + mode + std::to_string(world) + optimizer + ".pt");
    if (!fs::exists(out)) launchOk(world, {"--mode", mode, "--steps", "6", "--optimizer", optimizer, "--out", out});
    return out;
  }

  static inline std::string dir_;
};

double maxDifference(const ddp::StateDict& a, const ddp::StateDict& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (const auto& [key, t] : a) {
    auto it = b.find(key);
    if (it == b.end()) {
      ADD_FAILURE() << "no " << key;
      continue;
    }
    EXPECT_EQ(t.sizes(), it->second.sizes()) << key;
    if (t.sizes() != it->second.sizes()) return 1e30;
    d = std::max(d, (t.to(torch::kDouble) - it->second.to(torch::kDouble)).abs().max().item<double>());
  }
  return d;
}

// The model and optimizer entries of two one-file checkpoints are the same bytes.
void expectSameState(const std::string& a, const std::string& b) {
  const auto x = ddp::checkpoint::loadTrainingCheckpoint(a);
  const auto y = ddp::checkpoint::loadTrainingCheckpoint(b);
  for (const auto& [mine, theirs, what] : {std::tuple{&x.model, &y.model, "model"},
                                           std::tuple{&x.optimizer, &y.optimizer, "optimizer"}}) {
    ASSERT_EQ(mine->size(), theirs->size()) << what;
    ASSERT_FALSE(mine->empty()) << what;
    for (size_t i = 0; i < mine->size(); ++i) {
      const auto& [key, t] = (*mine)[i];
      EXPECT_EQ(key, (*theirs)[i].first) << what;
      EXPECT_TRUE(t.sizes() == (*theirs)[i].second.sizes() && t.equal((*theirs)[i].second)) << what << " " << key;
    }
  }
  EXPECT_EQ(x.globalStep, y.globalStep);
}

TEST_F(ShardedCheckpoint, SameWorldSizeResumeIsBitwiseAndTheFilesAreEachRanksRows) {
  const std::string reference = straight("full", 2, "adamw");
  const std::string ckpt = path("same");
  launchOk(2, {"--mode", "full", "--steps", "3", "--save-at", "3", "--dir", ckpt});
  const std::string sharded = (fs::path(ckpt) / "ckpt-00000003").string();
  ASSERT_TRUE(fs::is_directory(sharded));
  for (const char* file : {"manifest.json", "rank-00000.pt", "rank-00001.pt"}) {
    EXPECT_TRUE(fs::exists(fs::path(sharded) / file)) << file;
  }
  EXPECT_EQ(ddp::listCheckpoints(ckpt), std::vector<std::string>{sharded});
  // Linear(7, 5): 5 rows over 2 ranks are 3 + 2 (torch.chunk); the buffer only in rank 0's file.
  const auto rank0 = ddp::checkpoint::loadTrainingCheckpoint((fs::path(sharded) / "rank-00000.pt").string());
  const auto rank1 = ddp::checkpoint::loadTrainingCheckpoint((fs::path(sharded) / "rank-00001.pt").string());
  auto find = [](const ddp::checkpoint::NamedTensors& entries, const std::string& key) {
    for (const auto& [k, t] : entries) {
      if (k == key) return t;
    }
    return torch::Tensor();
  };
  EXPECT_EQ(find(rank0.model, "blocks.0.fc1.weight").sizes(), (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(find(rank1.model, "blocks.0.fc1.weight").sizes(), (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(find(rank1.optimizer, "exp_avg.blocks.0.fc1.weight").sizes(), (std::vector<int64_t>{2, 7}));
  EXPECT_TRUE(find(rank0.model, "scale").defined());
  EXPECT_FALSE(find(rank1.model, "scale").defined());

  const std::string resumed = path("same_resumed.pt");
  launchOk(2, {"--mode", "full", "--steps", "6", "--resume", "auto", "--dir", ckpt, "--out", resumed});
  EXPECT_EQ(maxDifference(ddp::loadTensors(resumed), ddp::loadTensors(reference)), 0.0);
}

TEST_F(ShardedCheckpoint, ReshardAtAnotherWorldSizeLoadsTheSavedValuesExactly) {
  for (const char* optimizer : {"adamw", "sgd"}) {
    SCOPED_TRACE(optimizer);
    const std::string ckpt = path(std::string("reshard_") + optimizer);
    launchOk(2, {"--mode", "full", "--steps", "3", "--save-at", "3", "--dir", ckpt, "--optimizer", optimizer});
    const std::string saved = (fs::path(ckpt) / "ckpt-00000003").string();
    const std::string whole = path(std::string("reshard_whole_") + optimizer + ".pt");
    ddp::consolidateCheckpoint(saved, whole);
    for (int world : {3, 1}) {
      SCOPED_TRACE(world);
      const std::string again = path(std::string("reshard_again_") + optimizer + std::to_string(world));
      launchOk(world, {"--mode", "full", "--steps", "3", "--resume", saved, "--resave", again, "--dir", ckpt,
                       "--optimizer", optimizer});
      const std::string againWhole = again + ".pt";
      ddp::consolidateCheckpoint((fs::path(again) / "ckpt-00000003").string(), againWhole);
      expectSameState(againWhole, whole);
    }
  }
}

TEST_F(ShardedCheckpoint, AnotherWorldSizeContinuesAsTheUnbrokenRun) {
  const std::string reference = straight("full", 2, "adamw");
  const std::string ckpt = path("continue");
  launchOk(2, {"--mode", "full", "--steps", "3", "--save-at", "3", "--dir", ckpt});
  const std::string out = path("continue_3.pt");
  launchOk(3, {"--mode", "full", "--steps", "6", "--resume", "auto", "--dir", ckpt, "--out", out});
  // The same global batches and mean gradients, summed in another order: float rounding only.
  EXPECT_LE(maxDifference(ddp::loadTensors(out), ddp::loadTensors(reference)), 1e-5);
}

TEST_F(ShardedCheckpoint, DdpCheckpointStartsAShardedRunAndBack) {
  // ddp::FusedAdamW (its state under Adam's names) where LibTorch has the fused kernel (2.x).
  const std::string optimizer = TORCH_VERSION_MAJOR >= 2 ? "fused" : "adamw";
  const std::string ckpt = path("ddp");
  launchOk(2, {"--mode", "ddp", "--steps", "3", "--save-at", "3", "--dir", ckpt, "--optimizer", optimizer});
  const std::string file = (fs::path(ckpt) / "ckpt-00000003.pt").string();
  ASSERT_TRUE(fs::is_regular_file(file));
  // DDP's file → 3 sharded ranks, saved again sharded: the same values.
  const std::string sharded = path("ddp_to_full");
  launchOk(3, {"--mode", "full", "--steps", "3", "--resume", file, "--resave", sharded, "--dir", ckpt,
               "--optimizer", optimizer});
  const std::string shardedWhole = path("ddp_to_full.pt");
  ddp::consolidateCheckpoint((fs::path(sharded) / "ckpt-00000003").string(), shardedWhole);
  expectSameState(shardedWhole, file);
  // And back: the sharded checkpoint → DDP on 2 ranks, saved again as one file.
  const std::string back = path("full_to_ddp");
  launchOk(2, {"--mode", "ddp", "--steps", "3", "--resume", (fs::path(sharded) / "ckpt-00000003").string(),
               "--resave", back, "--dir", ckpt, "--optimizer", optimizer});
  expectSameState((fs::path(back) / "ckpt-00000003.pt").string(), file);
  // Training on from the DDP file as a sharded run is the DDP run within float rounding.
  const std::string out = path("ddp_to_full_final.pt");
  launchOk(2, {"--mode", "full", "--steps", "6", "--resume", file, "--dir", ckpt, "--optimizer", optimizer, "--out", out});
  EXPECT_LE(maxDifference(ddp::loadTensors(out), ddp::loadTensors(straight("ddp", 2, optimizer))), 1e-5);
}

// ZeRO-2 (replicateParameters: the shards are rows of the kept full parameters) checkpoints its
// shards as full does: a bitwise resume, and its checkpoint loads into full at another world size.
TEST_F(ShardedCheckpoint, ZeroTwoResumesBitwiseAndItsCheckpointLoadsIntoFull) {
  const std::string reference = straight("zero2", 2, "adamw");
  const std::string ckpt = path("zero2");
  launchOk(2, {"--mode", "zero2", "--steps", "3", "--save-at", "3", "--dir", ckpt});
  const std::string resumed = path("zero2_resumed.pt");
  launchOk(2, {"--mode", "zero2", "--steps", "6", "--resume", "auto", "--dir", ckpt, "--out", resumed});
  EXPECT_EQ(maxDifference(ddp::loadTensors(resumed), ddp::loadTensors(reference)), 0.0);
  const std::string saved = (fs::path(ckpt) / "ckpt-00000003").string();
  const std::string whole = path("zero2_whole.pt");
  ddp::consolidateCheckpoint(saved, whole);
  const std::string again = path("zero2_to_full");
  launchOk(3, {"--mode", "full", "--steps", "3", "--resume", saved, "--resave", again, "--dir", ckpt});
  const std::string againWhole = path("zero2_to_full.pt");
  ddp::consolidateCheckpoint((fs::path(again) / "ckpt-00000003").string(), againWhole);
  expectSameState(againWhole, whole);
}

TEST_F(ShardedCheckpoint, AnotherModelOrADamagedFileFailsEveryRankWithOneLine) {
  const std::string ckpt = path("bad");
  launchOk(2, {"--mode", "full", "--steps", "2", "--save-at", "2", "--dir", ckpt});
  const std::string saved = (fs::path(ckpt) / "ckpt-00000002").string();

  auto other = launch(2, {"--mode", "full", "--steps", "3", "--resume", saved, "--hidden", "6", "--dir", ckpt});
  EXPECT_NE(other.exitCode, 0);
  EXPECT_FALSE(other.timedOut);
  // Keys in the state dict's (sorted) order: fc1's bias is the first that differs.
  EXPECT_NE(other.output.find("holds 'blocks.0.fc1.bias' of shape [5], but the model's is [6]"),
            std::string::npos)
      << other.output;

  // One byte of rank 1's file flipped (its size kept): rank 1's checksum fails, rank 0 hears of it.
  const std::string copy = path("bad_copy");
  fs::copy(saved, copy, fs::copy_options::recursive);
  {
    std::fstream f((fs::path(copy) / "rank-00001.pt").string(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-200, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-200, std::ios::end);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  auto damaged = launch(2, {"--mode", "full", "--steps", "3", "--resume", copy, "--dir", ckpt});
  EXPECT_NE(damaged.exitCode, 0);
  EXPECT_FALSE(damaged.timedOut);
  EXPECT_NE(damaged.output.find("rank-00001.pt"), std::string::npos) << damaged.output;
  EXPECT_NE(damaged.output.find("another rank could not read"), std::string::npos) << damaged.output;

  // A truncated file: the size check names it before any tensor is read.
  fs::resize_file(fs::path(copy) / "rank-00001.pt", 1000);
  auto truncated = launch(2, {"--mode", "full", "--steps", "3", "--resume", copy, "--dir", ckpt});
  EXPECT_NE(truncated.exitCode, 0);
  EXPECT_NE(truncated.output.find("has 1000 bytes, its manifest says"), std::string::npos) << truncated.output;
}

TEST_F(ShardedCheckpoint, AnInterruptedWriteIsNotResumedAndIsPruned) {
  const std::string ckpt = path("interrupted");
  launchOk(2, {"--mode", "full", "--steps", "2", "--save-at", "2", "--dir", ckpt});
  // A newer step's directory without its manifest (killed before rank 0 wrote it) is not a checkpoint.
  fs::create_directories(fs::path(ckpt) / "ckpt-00000009");
  fs::copy_file(fs::path(ckpt) / "ckpt-00000002" / "rank-00000.pt", fs::path(ckpt) / "ckpt-00000009" / "rank-00000.pt");
  fs::create_directories(fs::path(ckpt) / ".ckpt-00000011.tmp");
  EXPECT_EQ(ddp::listCheckpoints(ckpt), std::vector<std::string>{(fs::path(ckpt) / "ckpt-00000002").string()});
  const auto r = launch(2, {"--mode", "full", "--steps", "4", "--save-at", "4", "--resume", "auto", "--dir", ckpt});
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + (fs::path(ckpt) / "ckpt-00000002").string()), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(fs::path(ckpt) / ".ckpt-00000011.tmp"));  // a save prunes leftovers
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "ckpt-00000004" / "manifest.json"));
}

}  // namespace
