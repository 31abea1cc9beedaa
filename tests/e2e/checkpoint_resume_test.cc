// Checkpoints through the real programs: exact (bitwise) resume at world sizes 1 and 2, with the
// recipes, ZeRO and DataParallel, at another world size, and the checkpoint schedule (what goes
// wrong: checkpoint_failure_test.cc, in the same binary).
#include <fcntl.h>
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randperm.h>
#include <nlohmann/json.hpp>

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "ddp/autocast.h"
#include "ddp/fused_optim.h"
#include "tests/e2e/checkpoint_resume_support.h"
#include "tests/support/run_command.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/training_checkpoint.h"
#include "ddp/state_dict.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using namespace resume_test;

// `world` processes (mode ddp, or single for 1), or with `modeArgs` e.g. mode dp in one process.
void checkExactResume(int world, const std::vector<std::string>& modeArgs) {
  const std::string base = tempDir();
  auto args = [&](const std::string& name, std::vector<std::string> extra) {
    auto a = trainArgs(base + "/" + name, base + "/" + name + "-ckpt");
    a.insert(a.end(), modeArgs.begin(), modeArgs.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const auto full = launch(world, args("full", {"train.max_steps=30"}));
  ASSERT_EQ(full.exitCode, 0) << full.output;

  // Stop after step 18 (a checkpoint at 16 is the latest), then resume to 30.
  auto first = launch(world, args("split", {"train.max_steps=18"}));
  ASSERT_EQ(first.exitCode, 0) << first.output;
  const auto latest = checkpoint::latestValidCheckpoint(base + "/split-ckpt", nullptr);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(checkpoint::loadTrainingCheckpoint(*latest).globalStep, 16);
  auto second = launch(world, args("split", {"train.max_steps=30", "resume=auto"}));
  ASSERT_EQ(second.exitCode, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;

  test::expectRankParamsBitwiseEqual(base + "/full", base + "/split", world);
  const auto summaryA = nlohmann::json::parse(test::readFile(base + "/full/summary.json"));
  const auto summaryB = nlohmann::json::parse(test::readFile(base + "/split/summary.json"));
  EXPECT_EQ(summaryA["steps"], 30);
  EXPECT_EQ(summaryB["steps"], 30);
  EXPECT_EQ(summaryA["samples"], summaryB["samples"]);
  EXPECT_EQ(summaryA["test_correct"], summaryB["test_correct"]);
  // keep_last=2: only the two newest remain.
  EXPECT_EQ(checkpoint::listCheckpoints(base + "/full-ckpt").size(), 2u);
  fs::remove_all(base);
}

class ExactResume : public ::testing::TestWithParam<int> {};

TEST_P(ExactResume, StoppedAndResumedEqualsUninterruptedBitwise) { checkExactResume(GetParam(), {}); }

INSTANTIATE_TEST_SUITE_P(WorldSizes, ExactResume, ::testing::Values(1, 2));

// AdamW's moments and step count travel in the checkpoint; the lr schedule is a function of the
// step, so the resumed run continues on the same curve (train.decay_steps fixes the curve's length
// while train.max_steps differs between the two halves); clipping sees the same gradients.
TEST(ExactResumeRecipe, AdamWCosineClippingResumesBitwise) {
  checkExactResume(2, {"train.optimizer=adamw", "train.lr=0.01", "train.weight_decay=0.01",
                       "train.lr_schedule=cosine", "train.warmup_steps=5", "train.decay_steps=30",
                       "train.min_lr=0.0005", "train.clip_grad_norm=1.0"});
}

// train.fused=true with SGD (ddp::FusedSGD): its momentum buffers are SGD's state, so they travel
// in the checkpoint as LibTorch SGD's do and the resumed run is bitwise the uninterrupted one.
TEST(ExactResumeRecipe, FusedSgdNesterovResumesBitwise) {
  if (!FusedSGD::available(c10::DeviceType::CPU)) {
    const std::string dir = tempDir();
    const auto run = launch(2, {kConfig, "train.fused=true", "output.dir=" + dir + "/out"});
    EXPECT_EQ(run.exitCode, 2) << run.output;
    EXPECT_NE(run.output.find("config: 'train.fused' is true but this LibTorch has no fused SGD kernel"),
              std::string::npos)
        << run.output;
    fs::remove_all(dir);
    return;
  }
  checkExactResume(2, {"train.fused=true", "train.nesterov=true", "train.weight_decay=0.01"});
}

// fp16 on the CPU: the loss scaler's scale and growth tracker travel in the checkpoint as well. With
// a growth interval of 3 the scale changes on both sides of the resume point, and the scale decides
// how the fp16 backward rounds: a resumed run that restarted the scaler would not be bitwise equal.
TEST(ExactResumeRecipe, AdamWCosineFp16LossScalerResumesBitwise) {
  if (!Autocast::supports(c10::DeviceType::CPU, at::kHalf)) {
    // LibTorch 1.13 (Debian) cannot autocast the CPU to float16: the job says so in one line.
    const std::string dir = tempDir();
    const auto run = launch(2, {kConfig, "train.precision=fp16", "output.dir=" + dir + "/out"});
    EXPECT_EQ(run.exitCode, 2) << run.output;
    EXPECT_NE(run.output.find("config: 'train.precision' is fp16 but this LibTorch cannot autocast cpu to it; use "
                              "bf16 on a CPU"),
              std::string::npos)
        << run.output;
    fs::remove_all(dir);
    return;
  }
  checkExactResume(2, {"train.optimizer=adamw", "train.lr=0.01", "train.weight_decay=0.01",
                       "train.lr_schedule=cosine", "train.warmup_steps=5", "train.decay_steps=30",
                       "train.min_lr=0.0005", "train.clip_grad_norm=1.0", "train.precision=fp16",
                       "train.loss_scale_init=1024", "train.loss_scale_growth_interval=3"});
}

// train.zero (ZeRO stage 1): each rank steps its shard, the checkpoint gathers every shard's state,
// and a resume hands each rank its shard back: bitwise equal to the uninterrupted run, for AdamW and
// SGD with momentum.
TEST(ExactResumeZero, AdamWShardedResumesBitwise) {
  checkExactResume(2, {"train.zero=true", "train.optimizer=adamw", "train.lr=0.01", "train.weight_decay=0.01"});
}
TEST(ExactResumeZero, SgdMomentumShardedResumesBitwise) { checkExactResume(2, {"train.zero=true"}); }

// The sharded optimizer trains the unsharded one's model, and its checkpoint holds the unsharded
// optimizer's state under the same names (what PyTorch or a run without train.zero reads).
TEST(Zero, ShardedEqualsUnshardedModelAndCheckpoint) {
  const std::string base = tempDir();
  auto run = [&](const std::string& name, bool zero) {
    auto a = trainArgs(base + "/" + name, base + "/" + name + "-ckpt");
    a.push_back("train.optimizer=adamw");
    a.push_back("train.max_steps=12");
    if (zero) a.push_back("train.zero=true");
    const auto r = launch(3, a);
    EXPECT_EQ(r.exitCode, 0) << r.output;
  };
  run("plain", false);
  run("zero", true);
  test::expectRankParamsBitwiseEqual(base + "/plain", base + "/zero", 3);
  // Each rank held about a third of AdamW's state (two moments per element): the shards add up to it.
  const auto summaryPlain = nlohmann::json::parse(test::readFile(base + "/plain/summary.json"));
  const auto summaryZero = nlohmann::json::parse(test::readFile(base + "/zero/summary.json"));
  EXPECT_EQ(summaryZero["zero"], true);
  EXPECT_EQ(summaryPlain["zero"], false);
  const auto plainMb = summaryPlain["optimizer_state_mb_per_process"].get<std::vector<double>>();
  const auto zeroMb = summaryZero["optimizer_state_mb_per_process"].get<std::vector<double>>();
  ASSERT_EQ(zeroMb.size(), 3u);
  double shards = 0;
  for (double mb : zeroMb) {
    EXPECT_LT(mb, plainMb[0]) << "a rank holds the whole optimizer state";
    shards += mb;
  }
  EXPECT_NEAR(shards, plainMb[0], 1e-9);
  const auto plain = checkpoint::loadTrainingCheckpoint(*checkpoint::latestValidCheckpoint(base + "/plain-ckpt", nullptr));
  const auto zero = checkpoint::loadTrainingCheckpoint(*checkpoint::latestValidCheckpoint(base + "/zero-ckpt", nullptr));
  std::map<std::string, at::Tensor> want(plain.optimizer.begin(), plain.optimizer.end());
  ASSERT_EQ(zero.optimizer.size(), want.size());
  for (const auto& [key, value] : zero.optimizer) {
    ASSERT_TRUE(want.count(key)) << key;
    EXPECT_TRUE(at::equal(value, want.at(key))) << key;
  }
  fs::remove_all(base);
}

// mode dp runs the same loop (worker/train/training_loop.h), so its checkpoints resume exactly too:
// 2 replicas on CPU threads, the whole batch of 16 per step.
TEST(ExactResumeDp, StoppedAndResumedEqualsUninterruptedBitwise) {
  checkExactResume(1, {"mode=dp", "dp.replicas=2", "train.batch_size=16"});
}

// Resume at another world size continues the epoch from the next unseen sample (issue 29, 3):
// 100 samples, batch 4; 4 ranks stop after step 5 (checkpoint at 4: epoch 0, 64 positions of its
// permutation consumed), 2 ranks resume and stop after step 12 (checkpoint at 12: epoch 1, 24
// consumed), 3 ranks resume and finish 3 epochs. The batches each run trained on up to its last
// checkpoint (output.sample_log) make up every epoch: each sample exactly once, plus (pad) the
// padding of the epoch's last deal, which repeats the head of that epoch's permutation
// (torch.randperm(100, seed + epoch), PyTorch's DistributedSampler order); join pads nothing.
class ResumeAtAnotherWorldSize : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeAtAnotherWorldSize, EveryEpochSeesEverySampleOnce) {
  const std::string uneven = GetParam();
  const std::string base = tempDir();
  const int64_t n = 100, batch = 4, seed = 5;
  auto run = [&](int world, const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> a = {kConfig, "seed=" + std::to_string(seed), "model.hidden=[16]",
                                  "data.synthetic_train=" + std::to_string(n), "data.synthetic_test=32",
                                  "train.batch_size=" + std::to_string(batch), "train.epochs=3",
                                  "train.uneven_inputs=" + uneven, "eval.enabled=false", "output.sample_log=true",
                                  "output.dir=" + base + "/" + name, "checkpoint.dir=" + base + "/ckpt",
                                  "checkpoint.every_steps=2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return launch(world, a);
  };
  const auto a = run(4, "a", {"train.max_steps=5"});
  ASSERT_EQ(a.exitCode, 0) << a.output;
  const auto b = run(2, "b", {"train.max_steps=12", "resume=auto"});
  ASSERT_EQ(b.exitCode, 0) << b.output;
  EXPECT_NE(b.output.find("was written by 4 ranks, this job has 2; the 1st epoch continues after the 64 samples"),
            std::string::npos) << b.output;
  const auto c = run(3, "c", {"resume=auto"});
  ASSERT_EQ(c.exitCode, 0) << c.output;
  EXPECT_NE(c.output.find("was written by 2 ranks, this job has 3; the 2nd epoch continues after the 24 samples"),
            std::string::npos) << c.output;
  // Steps: 4 at world 4; epoch 0's other 36 samples at world 2 (18 per rank: 5 steps), epoch 1 at
  // world 2 to step 12; its other 76 samples at world 3 (26 per rank, 7 steps), epoch 2 at world 3
  // (34 per rank: 9 steps).
  const auto summary = nlohmann::json::parse(test::readFile(base + "/c/summary.json"));
  EXPECT_EQ(summary["steps"].get<int64_t>(), 4 + 5 + 3 + 7 + 9);

  // Each run's batches up to the checkpoint the next run resumed from (later ones are redone).
  std::map<int64_t, std::vector<int64_t>> seen;  // epoch → indices
  struct Part { std::string name; int world; int64_t firstStep, lastStep; };
  for (const Part& part : {Part{"a", 4, 1, 4}, Part{"b", 2, 5, 12}, Part{"c", 3, 13, 1000}}) {
    for (int r = 0; r < part.world; ++r) {
      std::ifstream in(base + "/" + part.name + "/samples_rank" + std::to_string(r) + ".txt");
      ASSERT_TRUE(in) << part.name << " rank " << r;
      std::string line;
      while (std::getline(in, line)) {
        std::istringstream fields(line);
        int64_t epoch = 0, step = 0, index = 0;
        fields >> epoch >> step;
        if (step < part.firstStep || step > part.lastStep) continue;
        while (fields >> index) seen[epoch].push_back(index);
      }
    }
  }
  ASSERT_EQ(seen.size(), 3u);
  // pad: the last deal of epoch 0 (36 at world 2) pads nothing, of epoch 1 (76 at world 3) and
  // epoch 2 (100 at world 3) 2 each, from the head of the epoch's permutation.
  const std::map<int64_t, int64_t> padding = {{0, 0}, {1, uneven == "pad" ? 2 : 0}, {2, uneven == "pad" ? 2 : 0}};
  for (auto& [epoch, indices] : seen) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed + epoch));
    const at::Tensor order = at::randperm(n, gen);
    std::vector<int64_t> expected(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = i;
    for (int64_t p = 0; p < padding.at(epoch); ++p) expected.push_back(order[p].item<int64_t>());
    std::sort(expected.begin(), expected.end());
    std::sort(indices.begin(), indices.end());
    EXPECT_EQ(indices, expected) << "epoch " << epoch << " (" << uneven << "): " << indices.size() << " samples seen";
  }
  fs::remove_all(base);
}

INSTANTIATE_TEST_SUITE_P(UnevenInputs, ResumeAtAnotherWorldSize, ::testing::Values("pad", "join"));

// output.sample_log: a fresh run's logs are its own (an earlier run's lines, and the files of ranks
// an earlier, larger run had, are gone); a resumed run appends after a line naming itself.
TEST(SampleLog, AFreshRunStartsItsLogsAndAResumedRunContinuesThem) {
  const std::string base = tempDir();
  const std::string out = base + "/out";
  fs::create_directories(out);
  for (int r : {0, 2, 3}) {
    std::ofstream(out + "/samples_rank" + std::to_string(r) + ".txt") << "# restart 0 world 4\n0 1 7 7 7\n";
  }
  auto args = trainArgs(out, base + "/ckpt");
  args.push_back("output.sample_log=true");
  auto lines = [&](int rank) {
    std::vector<std::string> all;
    std::ifstream in(out + "/samples_rank" + std::to_string(rank) + ".txt");
    for (std::string line; std::getline(in, line);) all.push_back(line);
    return all;
  };
  auto first = args;
  first.push_back("train.max_steps=3");
  const auto a = launch(2, first);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  EXPECT_FALSE(fs::exists(out + "/samples_rank2.txt"));
  EXPECT_FALSE(fs::exists(out + "/samples_rank3.txt"));
  for (int r : {0, 1}) {
    const auto got = lines(r);
    ASSERT_EQ(got.size(), 4u) << "rank " << r;  // its header and its 3 steps, of 8 samples each
    EXPECT_EQ(got[0], "# restart 0 world 2");
    for (int step = 1; step <= 3; ++step) {
      std::istringstream fields(got[static_cast<size_t>(step)]);
      int64_t epoch = -1, at = -1, index = 0, count = 0;
      fields >> epoch >> at;
      while (fields >> index) ++count;
      EXPECT_EQ(epoch, 0);
      EXPECT_EQ(at, step);
      EXPECT_EQ(count, 8);
    }
  }
  // Another fresh run (checkpoints every 4 steps: one at step 4), then a resume from it.
  auto second = args;
  second.push_back("train.max_steps=6");
  ASSERT_EQ(launch(2, second).exitCode, 0);  // a fresh run again (no resume): starts anew
  EXPECT_EQ(lines(0).size(), 7u);
  auto third = args;
  third.insert(third.end(), {"train.max_steps=8", "resume=auto"});  // resumes from step 4
  const auto c = launch(2, third);
  ASSERT_EQ(c.exitCode, 0) << c.output;
  const auto got = lines(0);
  ASSERT_EQ(got.size(), 7u + 1 + 4) << c.output;
  EXPECT_EQ(got[7], "# restart 0 world 2");
  EXPECT_EQ(got[8].substr(0, 4), "0 5 ");
  fs::remove_all(base);
}

TEST(CheckpointSchedule, EveryEpochSavesAtEpochEndsAsTheStartOfTheNext) {
  const std::string base = tempDir();
  // 200 samples, 2 ranks × 8 per step: ceil(100 / 8) = 13 steps per epoch.
  auto args = trainArgs(base + "/out", base + "/ckpt");
  args.push_back("checkpoint.every_steps=0");
  args.push_back("checkpoint.every_epochs=1");
  args.push_back("checkpoint.keep_last=0");
  args.push_back("train.max_steps=30");
  const auto run = launch(2, args);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_EQ(checkpoint::listCheckpoints(base + "/ckpt"),
            (std::vector<std::string>{checkpoint::checkpointPath(base + "/ckpt", 13),
                                      checkpoint::checkpointPath(base + "/ckpt", 26)}));
  const auto second = checkpoint::loadTrainingCheckpoint(checkpoint::checkpointPath(base + "/ckpt", 26));
  EXPECT_EQ(second.epoch, 2);
  EXPECT_EQ(second.stepInEpoch, 0);
  EXPECT_EQ(second.samples, 2 * 200);  // two whole epochs of the 200 samples (the last batch is short)
  fs::remove_all(base);
}

// A fine-tuning job (init.model_path, resume=auto) restarted after its first checkpoint: the
// checkpoint's weights replace the initial ones, so the pretrained file is not read at all — here it
// is gone by then (neither the start-up check nor a loader asks for it), and the run still resumes;
// before the first checkpoint it is read.
TEST(InitModel, ACheckpointToResumeReplacesTheInitialWeightsUnread) {
  const std::string base = tempDir();
  ASSERT_EQ(launch(1, {kConfig, "mode=single", "train.max_steps=2", "output.dir=" + base + "/pre"}).exitCode, 0);
  const std::string pretrained = base + "/pre/model.pt";
  auto fineTune = [&](int steps) {
    return launch(2, {kConfig, "init.model_path=" + pretrained, "resume=auto", "checkpoint.dir=" + base + "/ckpt",
                      "checkpoint.every_steps=2", "train.max_steps=" + std::to_string(steps), "eval.enabled=false",
                      "output.dir=" + base + "/fine"});
  };
  const auto first = fineTune(2);
  ASSERT_EQ(first.exitCode, 0) << first.output;
  EXPECT_NE(first.output.find("initial weights from " + pretrained), std::string::npos) << first.output;
  fs::remove(pretrained);
  const auto restarted = fineTune(4);
  ASSERT_EQ(restarted.exitCode, 0) << restarted.output;
  EXPECT_NE(restarted.output.find("init.model_path " + pretrained + " not read: the resumed checkpoint's weights "
                                  "replace it"),
            std::string::npos)
      << restarted.output;
  EXPECT_NE(restarted.output.find("resumed from"), std::string::npos) << restarted.output;
  fs::remove_all(base);
}

}  // namespace
}  // namespace ddp
