// Sharded training checkpoints of ddp::fullyShard models (ddp::Checkpointer): each run is
// sharded_checkpoint_program under ddp-launch (real processes, shm). Resume at the same world size
// is bitwise; a reshard at another world size loads exactly the saved values (its re-save
// consolidates to the same bytes) and training goes on as an unbroken run within float rounding;
// a DDP run's one-file checkpoint starts a sharded run and a sharded one a DDP run; a damaged or
// foreign checkpoint fails every rank with one line.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/checkpoint.h"
#include "ddp/state_dict.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/sharded_checkpoint.h"
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

// One byte `fromEnd` bytes before the end of `file` flipped, its size kept.
void flipByte(const std::string& file, int fromEnd) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-fromEnd, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  f.seekp(-fromEnd, std::ios::end);
  c = static_cast<char>(c ^ 0x5a);
  f.write(&c, 1);
  ASSERT_TRUE(f.good()) << file;
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
  // The manifest names each file with the checksum it stores (loadTrainingCheckpoint verified it).
  const auto manifest = ddp::checkpoint::readManifest(sharded);
  for (int r = 0; r < 2; ++r) {
    char expected[24];
    std::snprintf(expected, sizeof expected, "crc32:%08x", ddp::checkpoint::checksumOf(r == 0 ? rank0 : rank1));
    EXPECT_EQ(manifest["files"][r].value("checksum", ""), expected) << r;
  }
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
  flipByte((fs::path(copy) / "rank-00001.pt").string(), 200);
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

// resume=auto: the newest checkpoint with a damaged rank file (rank 1 names it) is skipped by both
// ranks, the older one resumed, and the step saved again over the damaged directory: the run ends
// in the bytes the undamaged checkpoint held (resume is bitwise), and nothing of the swap is left.
TEST_F(ShardedCheckpoint, ResumeAutoGoesPastADamagedRankFileAndSavesItsStepAgain) {
  const std::string ckpt = path("auto_damaged");
  launchOk(2, {"--mode", "full", "--steps", "2", "--save-at", "2", "--dir", ckpt});
  launchOk(2, {"--mode", "full", "--steps", "4", "--save-at", "4", "--resume", "auto", "--dir", ckpt});
  const std::string newest = (fs::path(ckpt) / "ckpt-00000004").string();
  const std::string before = path("auto_damaged_before.pt");
  ddp::consolidateCheckpoint(newest, before);
  flipByte((fs::path(newest) / "rank-00001.pt").string(), 200);
  const auto r = launch(2, {"--mode", "full", "--steps", "4", "--save-at", "4", "--resume", "auto", "--dir", ckpt});
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("resume: skipping " + newest + ": '" + newest + "/rank-00001.pt' is "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resumed from " + (fs::path(ckpt) / "ckpt-00000002").string()), std::string::npos)
      << r.output;
  const std::string after = path("auto_damaged_after.pt");
  ddp::consolidateCheckpoint(newest, after);
  expectSameState(after, before);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ckpt)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt-00000002", "ckpt-00000004"}));
}

// A save that meets a full disk (a 4 KiB tmpfs, in a mount namespace of its own) fails with the line
// a one-file save gives: what keepLast asks for, and where to free space.
TEST_F(ShardedCheckpoint, AFullDiskSaysWhyASaveNeedsRoom) {
  if (::geteuid() != 0 || std::system("unshare -m true") != 0) GTEST_SKIP() << "needs root and unshare -m";
  const std::string mnt = path("full_disk");
  fs::create_directories(mnt);
  const std::string job = std::string(DDP_LAUNCH) + " --nproc_per_node=2 " + PROGRAM +
                          " --mode full --steps 3 --save-at 3 --dir " + mnt;
  ddp::test::CommandOptions options;
  options.timeoutSeconds = 120;
  options.extraEnv = {"DDP_TEST_BACKEND=shm"};
  const auto r = runCommand(
      {"/usr/bin/unshare", "-m", "/bin/sh", "-c", "mount -t tmpfs -o size=4k tmpfs " + mnt + " && exec " + job}, options);
  EXPECT_NE(r.exitCode, 0);
  EXPECT_FALSE(r.timedOut);
  // The program keeps every checkpoint (keepLast 0).
  EXPECT_NE(r.output.find("No space left on device; ddp::CheckpointOptions::keepLast=0 keeps every checkpoint: free "
                          "space (or inodes: df -i) in " + mnt),
            std::string::npos)
      << r.output;
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

// Hand-made sharded checkpoints, in the layout saveShardedCheckpoint writes: step 7 of 3 ranks, the
// sharded "w" [6, 2] holding 0..11 (rows 0-1, 2-3, 4-5 in rank 0's, 1's, 2's file: the last two
// files of one size) and "b" [3] whole in rank 0's file. Each damage is one CheckpointError.
class ShardedManifest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ddp::test::makeTempDir("sharded_manifest_test");
    ckpt_ = (fs::path(dir_) / "ckpt-00000007").string();
    fs::create_directories(ckpt_);
    nlohmann::json files = nlohmann::json::array();
    for (int r = 0; r < 3; ++r) {
      const auto state = rankState(r, 7);
      ddp::checkpoint::saveTrainingCheckpoint(state, file(r));
      files.push_back({{"name", name(r)}, {"bytes", fs::file_size(file(r))}, {"checksum", checksum(state)}});
    }
    manifest_ = {{"format", ddp::checkpoint::kShardedCheckpointFormat}, {"world_size", 3}, {"global_step", 7},
                 {"files", files}, {"tensors", {{"w", {{"shape", {6, 2}}, {"rows", {{0, 2}, {2, 4}, {4, 6}}}}}}}};
    writeManifest(manifest_.dump());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static ddp::checkpoint::TrainingState rankState(int rank, int64_t step) {
    ddp::checkpoint::TrainingState s;
    s.model.emplace_back("w", torch::arange(4 * rank, 4 * rank + 4, torch::kFloat).reshape({2, 2}));
    if (rank == 0) s.model.emplace_back("b", torch::tensor({1.f, 2.f, 3.f}));
    s.globalStep = step;
    s.worldSize = 3;
    s.cpuRng = torch::zeros({4}, torch::kByte);
    return s;
  }
  static std::string checksum(const ddp::checkpoint::TrainingState& s) {
    char text[24];
    std::snprintf(text, sizeof text, "crc32:%08x", ddp::checkpoint::checksumOf(s));
    return text;
  }
  static std::string name(int r) { return "rank-0000" + std::to_string(r) + ".pt"; }
  std::string file(int r) const { return (fs::path(ckpt_) / name(r)).string(); }
  void writeManifest(const std::string& text) const {
    std::ofstream((fs::path(ckpt_) / "manifest.json").string(), std::ios::trunc) << text;
  }
  // The CheckpointError's message of loading the checkpoint; "" when it loads.
  std::string loadError() const {
    try {
      (void)ddp::checkpoint::loadTrainingStateFor(ckpt_, nullptr);
    } catch (const ddp::CheckpointError& e) {
      return e.what();
    }
    return "";
  }

  std::string dir_, ckpt_;
  nlohmann::json manifest_;
};

TEST_F(ShardedManifest, TheHandMadeCheckpointLoadsWhole) {
  const auto state = ddp::checkpoint::loadTrainingStateFor(ckpt_, nullptr);
  ASSERT_EQ(state.model.size(), 2u);
  EXPECT_EQ(state.model[0].first, "w");
  EXPECT_TRUE(state.model[0].second.equal(torch::arange(12, torch::kFloat).reshape({6, 2})));
  EXPECT_TRUE(state.model[1].second.equal(torch::tensor({1.f, 2.f, 3.f})));
}

// Everywhere a model file is read (eval.model_path, init.model_path, generate.model_path), a sharded
// checkpoint's directory reads as its model, every tensor whole.
TEST_F(ShardedManifest, ItsDirectoryIsAModelFile) {
  const ddp::StateDict model = ddp::loadModelStateDict(ckpt_);
  ASSERT_EQ(model.size(), 2u);
  EXPECT_TRUE(model.at("w").equal(torch::arange(12, torch::kFloat).reshape({6, 2})));
  EXPECT_TRUE(model.at("b").equal(torch::tensor({1.f, 2.f, 3.f})));
}

TEST_F(ShardedManifest, RankFilesSwappedAreRefused) {
  ASSERT_EQ(fs::file_size(file(1)), fs::file_size(file(2)));  // the manifest's sizes still fit
  fs::rename(file(1), file(1) + ".x");
  fs::rename(file(2), file(1));
  fs::rename(file(1) + ".x", file(2));
  EXPECT_NE(loadError().find("is not the file its manifest lists"), std::string::npos) << loadError();
}

TEST_F(ShardedManifest, AFileOfAnotherCheckpointIsRefusedWithoutChecksumsToo) {
  for (auto& f : manifest_["files"]) f.erase("checksum");  // a manifest written before checksums
  writeManifest(manifest_.dump());
  ddp::checkpoint::saveTrainingCheckpoint(rankState(1, 5), file(1));  // step 5's file, the same size
  ASSERT_EQ(fs::file_size(file(1)), manifest_["files"][1]["bytes"].get<uintmax_t>());
  EXPECT_NE(loadError().find("was written at step 5 by 3 ranks, but its manifest is of step 7"), std::string::npos)
      << loadError();
}

TEST_F(ShardedManifest, AnEditedOrTruncatedManifestIsOneCheckpointErrorAndResumeAutoSkipsIt) {
  // An older, valid one-file checkpoint beside it: resume=auto falls back to it.
  const std::string older = (fs::path(dir_) / "ckpt-00000003.pt").string();
  ddp::checkpoint::saveTrainingCheckpoint(rankState(0, 3), older);
  const std::string good = manifest_.dump();
  std::vector<std::string> damaged = {good.substr(0, good.size() / 2), "[]", "null"};
  for (const auto& [pointer, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"/format", 1},
           {"/files/1", "rank-00001.pt"},
           {"/files/1/name", "../rank-00001.pt"},
           {"/files/1/bytes", -5},
           {"/world_size", 2},
           {"/global_step", "seven"},
           {"/tensors", nlohmann::json::array()},
           {"/tensors/w/shape", nlohmann::json::array()},
           {"/tensors/w/shape/0", 7},
           {"/tensors/w/rows", {{0, 2}, {2, 4}}},
           {"/tensors/w/rows/1", {3, 4}},
           {"/tensors/w/rows/2/1", "6"}}) {
    nlohmann::json m = manifest_;
    m[nlohmann::json::json_pointer(pointer)] = value;
    damaged.push_back(m.dump());
  }
  for (const auto& text : damaged) {
    SCOPED_TRACE(text);
    writeManifest(text);
    EXPECT_NE(loadError().find("manifest.json' is damaged ("), std::string::npos) << loadError();
    std::vector<std::string> skipped;
    const auto found = ddp::checkpoint::latestValidCheckpoint(
        dir_, [&](const std::string& p, const std::string&) { skipped.push_back(p); });
    EXPECT_EQ(found, std::optional<std::string>(older));
    EXPECT_EQ(skipped, std::vector<std::string>{ckpt_});
  }
}

TEST_F(ShardedManifest, ARankFileGivenAsTheCheckpointIsRefused) {
  std::string error;
  try {
    (void)ddp::checkpoint::loadTrainingStateFor(file(0), nullptr);
  } catch (const ddp::CheckpointError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("is one rank's part of the sharded checkpoint '" + ckpt_ + "'"), std::string::npos) << error;
}

TEST_F(ShardedManifest, AStepOfMoreDigitsThanAnInt64IsNotListed) {
  const fs::path huge = fs::path(dir_) / "ckpt-99999999999999999999";
  fs::create_directories(huge);
  fs::copy_file(fs::path(ckpt_) / "manifest.json", huge / "manifest.json");
  std::ofstream((fs::path(dir_) / "ckpt-99999999999999999999.pt").string()) << "x";
  EXPECT_EQ(ddp::checkpoint::listCheckpoints(dir_), std::vector<std::string>{ckpt_});
}

}  // namespace
