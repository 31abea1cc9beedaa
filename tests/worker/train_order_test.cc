// The loop's token order (worker/train/train_order.h tokenOrder) over ddp::TokenSampler: the plan of
// an epoch, the positions a checkpoint records, and a resume at another world size that continues
// with the windows no rank has seen (sequential), by the formula of llm.c's order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ddp/token_data.h"
#include "worker/train/train_order.h"

namespace ddp::worker {
namespace {

// One raw uint16 shard of `tokens` tokens (token i = i % 1000) in a fresh directory.
std::shared_ptr<const TokenData> shardOf(int64_t tokens) {
  const auto dir = std::filesystem::temp_directory_path() / ("ddp_order_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "train.bin").string();
  std::ofstream out(path, std::ios::binary);
  for (int64_t i = 0; i < tokens; ++i) {
    const auto t = static_cast<uint16_t>(i % 1000);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  out.close();
  auto data = std::make_shared<const TokenData>(path, "test");
  std::filesystem::remove_all(dir);  // mapped: the pages stay while the mapping does
  return data;
}

TokenSamplerOptions options(int rank, int world) {
  TokenSamplerOptions o;
  o.batchSize = 3;
  o.blockSize = 8;
  o.rank = rank;
  o.world = world;
  o.sampling = TokenSampling::kSequential;
  return o;
}

TEST(TokenOrder, SequentialEpochIsLlmcsRowsAndAResumeAtAnotherWorldSizeTakesTheRest) {
  const auto data = shardOf(8 * 100 + 1);  // 100 rows of 8 tokens (+1 for the last target)
  std::set<int64_t> seen;
  // Two ranks, 4 steps: rank r's slot k holds rows k*6 + r*3 .. +3 (llm.c's stride), starts = row × 8.
  for (int rank = 0; rank < 2; ++rank) {
    auto order = tokenOrder(data, options(rank, 2));
    EXPECT_EQ(order->epochSize(), 100);
    EXPECT_EQ(order->setEpoch(0, 0, 0), 16);  // floor(100 / 6)
    const auto plan = order->batches();
    ASSERT_EQ(plan.size(), 16u);
    for (int64_t k = 0; k < 4; ++k) {
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(plan[static_cast<size_t>(k)][static_cast<size_t>(j)], (k * 6 + rank * 3 + j) * 8);
        seen.insert(plan[static_cast<size_t>(k)][static_cast<size_t>(j)] / 8);
      }
    }
    EXPECT_EQ(order->positionAfter(4), 24);  // what the checkpoint after 4 steps records
  }
  // Resumed by three ranks at row 24: 25 steps of 9 rows would be 225; floor(76 / 9) = 8 slots.
  for (int rank = 0; rank < 3; ++rank) {
    auto order = tokenOrder(data, options(rank, 3));
    EXPECT_EQ(order->setEpoch(0, 24, 4), 8);
    for (const auto& batch : order->batches()) {
      for (const int64_t start : batch) {
        EXPECT_TRUE(seen.insert(start / 8).second) << "row " << start / 8 << " seen twice";
      }
    }
  }
  // Every row but the 4 the last step could not fill: 24 + 8 × 9 = 96.
  EXPECT_EQ(seen.size(), 96u);
  EXPECT_EQ(*seen.rbegin(), 95);
}

TEST(TokenOrder, TheLoaderMakesTheWindowsAndTheirNextTokens) {
  const auto data = shardOf(8 * 20 + 1);
  auto order = tokenOrder(data, options(1, 2));
  order->setEpoch(0, 0, 0);
  auto plan = order->batches();
  plan.resize(1);
  auto loader = order->loader(plan, data::LoaderOptions{});
  const data::Batch b = loader->next();
  ASSERT_EQ(b.images.sizes(), (std::vector<int64_t>{3, 8}));
  // Rank 1's first row is row 3: tokens 24..31, targets 25..32.
  EXPECT_EQ(b.images[0][0].item<int64_t>(), 24);
  EXPECT_EQ(b.images[2][7].item<int64_t>(), 5 * 8 + 7);
  EXPECT_EQ(b.labels[0][0].item<int64_t>(), 25);
  EXPECT_EQ(b.labels[2][7].item<int64_t>(), 5 * 8 + 8);
}

// Random windows: a slot's draws depend on (seed, rank, the run's micro-batch), so the same position
// gives the same batch, whoever asks, and a resumed run draws what the interrupted one would have.
TEST(TokenOrder, RandomDrawsDependOnThePositionOnly) {
  const auto data = shardOf(8 * 50 + 1);
  auto o = options(0, 2);
  o.sampling = TokenSampling::kRandom;
  auto straight = tokenOrder(data, o);
  straight->setEpoch(1, 0, 8);  // after the 8 steps of epoch 0 (50 rows / 6 a step)
  const auto all = straight->batches();
  auto resumed = tokenOrder(data, o);
  resumed->setEpoch(1, 2 * 6, 10);  // after two steps of 2 ranks × 3
  const auto rest = resumed->batches();
  ASSERT_EQ(rest.size() + 2, all.size());
  for (size_t k = 0; k < rest.size(); ++k) EXPECT_EQ(rest[k], all[k + 2]) << k;
  straight->setEpoch(0, 0, 0);
  EXPECT_NE(straight->batches()[0], all[0]) << "another epoch draws other windows";
}

// A resume at another world size draws windows no step drew before: 5 steps of one rank (rows 0-14),
// then two ranks from row 15 at the run's 6th micro-batch. (The key was the epoch's rows / this
// world's rows per step: 15 / 6 = 2, so rank 0 drew the one-rank run's steps 3, 4, 5... again.)
TEST(TokenOrder, RandomDrawsAfterAResumeAtAnotherWorldSizeAreNew) {
  const auto data = shardOf(8 * 500 + 1);
  auto one = options(0, 1);
  one.sampling = TokenSampling::kRandom;
  auto alone = tokenOrder(data, one);
  alone->setEpoch(0, 0, 0);
  auto drawn = alone->batches();
  drawn.resize(5);
  std::set<std::vector<int64_t>> before(drawn.begin(), drawn.end());
  ASSERT_EQ(before.size(), 5u);
  for (int rank = 0; rank < 2; ++rank) {
    auto o = options(rank, 2);
    o.sampling = TokenSampling::kRandom;
    auto resumed = tokenOrder(data, o);
    resumed->setEpoch(0, 5 * 3, 5);
    for (const auto& batch : resumed->batches()) {
      EXPECT_EQ(before.count(batch), 0u) << "rank " << rank << " drew a batch of the run before the resume again";
    }
  }
}

// A resume with fewer micro-batches a step (train.accumulate_steps 4 -> 1) draws windows no earlier
// micro-batch drew: the checkpoint after 3 steps of 4 records the run's 12 micro-batches, and the
// draws go on from the 13th. Counted from its 3 optimizer steps × 1 instead (a checkpoint without
// micro_steps), the resumed steps would draw micro-batches 4-11 again.
TEST(TokenOrder, RandomDrawsAfterAResumeWithFewerMicroBatchesAStepAreNew) {
  const auto data = shardOf(8 * 500 + 1);
  auto o = options(0, 2);
  o.sampling = TokenSampling::kRandom;
  auto before = tokenOrder(data, o);
  before->setEpoch(0, 0, microStepsAfter(0, -1, 0, 4));
  auto drawn = before->batches();
  ASSERT_GE(drawn.size(), 20u);
  drawn.resize(3 * 4);
  const std::set<std::vector<int64_t>> seen(drawn.begin(), drawn.end());
  ASSERT_EQ(seen.size(), 12u);
  const int64_t recorded = microStepsAfter(0, -1, 3, 4);  // what the checkpoint at step 3 records
  EXPECT_EQ(recorded, 12);
  const int64_t consumed = before->positionAfter(12);
  for (const bool withMicroSteps : {true, false}) {
    auto resumed = tokenOrder(data, o);
    resumed->setEpoch(0, consumed, microStepsAfter(3, withMicroSteps ? recorded : -1, 3, 1));
    auto next = resumed->batches();
    next.resize(8);  // the resumed run's steps 4-11 of one micro-batch
    int64_t again = 0;
    for (const auto& batch : next) again += static_cast<int64_t>(seen.count(batch));
    EXPECT_EQ(again, withMicroSteps ? 0 : 8) << (withMicroSteps ? "micro_steps recorded" : "not recorded");
  }
  // Two steps after the resume at 1 a step: 14 micro-batches, the next key.
  EXPECT_EQ(microStepsAfter(3, recorded, 5, 1), 14);
}

}  // namespace
}  // namespace ddp::worker
