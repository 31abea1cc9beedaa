// Unit tests of DistributedSampler: sizes from the formulas in PyTorch's
// distributed.py, and the coverage/disjointness properties they imply.
#include "sampler/distributed_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "common/error.h"
#include "sampler/batching.h"

namespace ddp::sampler {
namespace {

const int64_t kSizes[] = {0, 1, 3, 7, 10, 17, 100, 1001};
const int64_t kWorlds[] = {1, 2, 3, 4, 8};

DistributedSampler make(int64_t n, int64_t world, int64_t rank, bool shuffle, bool dropLast,
                        uint64_t seed = 0) {
  DistributedSamplerOptions options;
  options.numReplicas = world;
  options.rank = rank;
  options.shuffle = shuffle;
  options.seed = seed;
  options.dropLast = dropLast;
  return DistributedSampler(n, options);
}

// Every rank's list for one epoch, concatenated in rank order.
std::vector<int64_t> allRanks(int64_t n, int64_t world, bool shuffle, bool dropLast,
                              int64_t epoch) {
  std::vector<int64_t> all;
  for (int64_t r = 0; r < world; ++r) {
    auto s = make(n, world, r, shuffle, dropLast, 7);
    s.setEpoch(epoch);
    const auto mine = s.indices();
    EXPECT_EQ(static_cast<int64_t>(mine.size()), s.numSamples());
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

TEST(DistributedSampler, SizesFollowPythonFormula) {
  for (int64_t n : kSizes) {
    for (int64_t world : kWorlds) {
      for (bool dropLast : {false, true}) {
        // Literal transcription of Python's float arithmetic.
        const double expected =
            (dropLast && n % world != 0)
                ? std::ceil(static_cast<double>(n - world) / static_cast<double>(world))
                : std::ceil(static_cast<double>(n) / static_cast<double>(world));
        const auto s = make(n, world, world - 1, true, dropLast);
        EXPECT_EQ(s.numSamples(), static_cast<int64_t>(expected))
            << "n=" << n << " world=" << world << " dropLast=" << dropLast;
        EXPECT_EQ(s.totalSize(), s.numSamples() * world);
        EXPECT_EQ(static_cast<int64_t>(s.indices().size()), s.numSamples());
      }
    }
  }
}

TEST(DistributedSampler, PaddedEpochCoversDataset) {
  for (int64_t n : kSizes) {
    for (int64_t world : kWorlds) {
      for (bool shuffle : {false, true}) {
        const auto all = allRanks(n, world, shuffle, /*dropLast=*/false, 3);
        const std::set<int64_t> seen(all.begin(), all.end());
        EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "n=" << n << " world=" << world;
        if (n > 0) {
          EXPECT_EQ(*seen.begin(), 0);
          EXPECT_EQ(*seen.rbegin(), n - 1);
        }
        // Padding adds at most world - 1 repeats when n >= world.
        if (n >= world) {
          EXPECT_LT(static_cast<int64_t>(all.size()) - n, world);
        }
      }
    }
  }
}

TEST(DistributedSampler, RanksAreDisjointWhenDivisibleOrDropLast) {
  for (int64_t n : kSizes) {
    for (int64_t world : kWorlds) {
      for (bool shuffle : {false, true}) {
        for (bool dropLast : {false, true}) {
          if (n % world != 0 && !dropLast) {
            continue;
          }
          const auto all = allRanks(n, world, shuffle, dropLast, 1);
          const std::set<int64_t> seen(all.begin(), all.end());
          EXPECT_EQ(seen.size(), all.size()) << "n=" << n << " world=" << world;
          EXPECT_EQ(static_cast<int64_t>(all.size()), (n / world) * world);
          for (int64_t i : all) {
            EXPECT_GE(i, 0);
            EXPECT_LT(i, n);
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, UnshuffledIsStridedRange) {
  const auto s = make(10, 3, 1, /*shuffle=*/false, /*dropLast=*/false);
  // Padded list 0..9,0,1 (total 12); rank 1 takes positions 1,4,7,10.
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{1, 4, 7, 0}));
  const auto d = make(10, 3, 1, /*shuffle=*/false, /*dropLast=*/true);
  EXPECT_EQ(d.indices(), (std::vector<int64_t>{1, 4, 7}));
}

TEST(DistributedSampler, PadsByRepeatingWholeListWhenWorldExceedsDataset) {
  // n=3, world=8: padded list is 0,1,2,0,1,2,0,1.
  const std::vector<int64_t> padded = {0, 1, 2, 0, 1, 2, 0, 1};
  for (int64_t r = 0; r < 8; ++r) {
    const auto s = make(3, 8, r, /*shuffle=*/false, /*dropLast=*/false);
    EXPECT_EQ(s.indices(), (std::vector<int64_t>{padded[static_cast<size_t>(r)]}));
    // drop_last with n < world leaves nothing.
    EXPECT_TRUE(make(3, 8, r, false, true).indices().empty());
  }
}

TEST(DistributedSampler, ShuffleDependsOnSeedAndEpochOnly) {
  auto a = make(100, 1, 0, true, false, 42);
  auto b = make(100, 1, 0, true, false, 42);
  EXPECT_EQ(a.indices(), b.indices());
  EXPECT_EQ(a.indices(), a.indices());
  const auto epoch0 = a.indices();
  a.setEpoch(1);
  EXPECT_EQ(a.epoch(), 1);
  EXPECT_NE(a.indices(), epoch0);
  // seed + epoch is what matters, as in Python.
  auto c = make(100, 1, 0, true, false, 43);
  EXPECT_EQ(c.indices(), a.indices());
  auto sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  }
}

TEST(DistributedSampler, EmptyDatasetGivesEmptyEpochs) {
  for (bool dropLast : {false, true}) {
    const auto s = make(0, 4, 2, true, dropLast);
    EXPECT_EQ(s.numSamples(), 0);
    EXPECT_EQ(s.totalSize(), 0);
    EXPECT_TRUE(s.indices().empty());
  }
}

void expectConfigError(int64_t n, int64_t world, int64_t rank, const std::string& fragment) {
  try {
    make(n, world, rank, true, false);
    ADD_FAILURE() << "no error for n=" << n << " world=" << world << " rank=" << rank;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// pad = false (uneven shards, for Join): every index exactly once over the ranks, rank r holding
// ceil((N - r) / W) of them, each the start of its padded list (PyTorch's order, unpadded).
TEST(DistributedSampler, UnpaddedShardsCoverEveryIndexOnce) {
  for (int64_t n : kSizes) {
    for (int64_t world : kWorlds) {
      std::vector<int64_t> all;
      for (int64_t r = 0; r < world; ++r) {
        DistributedSamplerOptions options;
        options.numReplicas = world;
        options.rank = r;
        options.seed = 7;
        options.pad = false;
        DistributedSampler unpadded(n, options);
        unpadded.setEpoch(3);
        const int64_t expected = n > r ? (n - r + world - 1) / world : 0;
        EXPECT_EQ(unpadded.numSamples(), expected) << "n=" << n << " world=" << world << " rank=" << r;
        for (int64_t q = 0; q < world; ++q) {
          EXPECT_EQ(unpadded.numSamplesOf(q), n > q ? (n - q + world - 1) / world : 0);
        }
        const auto mine = unpadded.indices();
        ASSERT_EQ(static_cast<int64_t>(mine.size()), expected);
        auto padded = make(n, world, r, true, false, 7);
        padded.setEpoch(3);
        const auto head = padded.indices();
        EXPECT_TRUE(std::equal(mine.begin(), mine.end(), head.begin())) << "n=" << n << " world=" << world;
        all.insert(all.end(), mine.begin(), mine.end());
      }
      EXPECT_EQ(static_cast<int64_t>(all.size()), n);
      std::sort(all.begin(), all.end());
      for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i);
    }
  }
}

// The batch arithmetic of a loop, by hand: N = 10 over 4 ranks, batches of 2.
TEST(DistributedSampler, BatchArithmeticByHand) {
  DistributedSamplerOptions options;
  options.numReplicas = 4;
  DistributedSampler padded(10, options);  // 3 samples per rank, 12 positions with the padding
  EXPECT_EQ(padded.batchesPerRank(2), 2);
  EXPECT_EQ(padded.batchesPerRank(2, /*dropLast=*/true), 1);
  EXPECT_EQ(padded.samplesInBatches(0, 1, 2), 8);  // 2 per rank
  EXPECT_EQ(padded.samplesInBatches(1, 1, 2), 4);  // the last one, 1 per rank
  EXPECT_EQ(padded.samplesInBatches(0, 2, 2), 12);
  EXPECT_EQ(padded.positionAfter(1, 2), 8);
  EXPECT_EQ(padded.positionAfter(2, 2), 10);       // the padding goes past the end: capped
  options.pad = false;
  DistributedSampler unpadded(10, options);        // shards of 3, 3, 2, 2
  EXPECT_EQ(unpadded.batchesPerRank(2), 2);
  EXPECT_EQ(unpadded.samplesInBatches(1, 1, 2), 2);  // ranks 2 and 3 have nothing left
  EXPECT_EQ(unpadded.samplesInBatches(0, 5, 2), 10);
  unpadded.setEpoch(0, 5);                         // 5 positions left: shards of 2, 1, 1, 1
  EXPECT_EQ(unpadded.batchesPerRank(1), 2);
  EXPECT_EQ(unpadded.positionAfter(1, 1), 9);
  EXPECT_EQ(unpadded.positionAfter(0, 1), 5);
  EXPECT_THROW(unpadded.batchesPerRank(0), ConfigError);
  EXPECT_THROW(unpadded.samplesInBatches(-1, 1, 2), ConfigError);
  EXPECT_THROW(unpadded.positionAfter(-1, 2), ConfigError);
}

// The arithmetic against the batches themselves: batchesPerRank is the most any rank has,
// samplesInBatches the sizes of the ranks' batch slots, and positionAfter the position from which
// the rest of the epoch is exactly what the ranks have not taken (unshuffled, position p holds p).
TEST(DistributedSampler, BatchArithmeticMatchesTheBatches) {
  for (bool pad : {true, false}) {
    for (int64_t n : {1, 7, 10, 17, 100}) {
      for (int64_t world : {1, 2, 3, 4}) {
        for (int64_t start : {int64_t{0}, n / 3}) {
          for (int64_t batch : {1, 2, 5}) {
            const std::string where = "pad=" + std::to_string(pad) + " n=" + std::to_string(n) +
                                      " world=" + std::to_string(world) + " start=" + std::to_string(start) +
                                      " batch=" + std::to_string(batch);
            std::vector<std::vector<std::vector<int64_t>>> perRank;
            DistributedSamplerOptions options;
            options.numReplicas = world;
            options.shuffle = false;
            options.pad = pad;
            for (int64_t r = 0; r < world; ++r) {
              options.rank = r;
              DistributedSampler s(n, options);
              s.setEpoch(0, start);
              perRank.push_back(makeBatches(s.indices(), batch, false));
            }
            options.rank = 0;
            DistributedSampler sampler(n, options);
            sampler.setEpoch(0, start);
            size_t most = 0;
            for (const auto& b : perRank) most = std::max(most, b.size());
            EXPECT_EQ(sampler.batchesPerRank(batch), static_cast<int64_t>(most)) << where;
            for (int64_t taken = 0; taken <= static_cast<int64_t>(most); ++taken) {
              int64_t inSlot = 0;
              std::set<int64_t> seen;
              for (const auto& b : perRank) {
                if (taken < static_cast<int64_t>(most) && taken < static_cast<int64_t>(b.size())) {
                  inSlot += static_cast<int64_t>(b[static_cast<size_t>(taken)].size());
                }
                for (int64_t k = 0; k < std::min<int64_t>(taken, static_cast<int64_t>(b.size())); ++k) {
                  seen.insert(b[static_cast<size_t>(k)].begin(), b[static_cast<size_t>(k)].end());
                }
              }
              if (taken < static_cast<int64_t>(most)) EXPECT_EQ(sampler.samplesInBatches(taken, 1, batch), inSlot) << where;
              // The taken positions are exactly [start, positionAfter), the padding's repeats aside
              // (positions past the end hold the head: the values below start).
              if (pad) seen.erase(seen.begin(), seen.lower_bound(start));
              const int64_t after = sampler.positionAfter(taken, batch);
              std::set<int64_t> prefix;
              for (int64_t p = start; p < after; ++p) prefix.insert(p);
              EXPECT_EQ(seen, prefix) << where << " taken=" << taken;
            }
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, RejectsInvalidOptions) {
  expectConfigError(10, 4, 4, "invalid rank 4, rank should be in the interval [0, 3]");
  expectConfigError(10, 4, -1, "invalid rank -1");
  expectConfigError(10, 0, 0, "numReplicas (world size) must be >= 1, got 0");
  expectConfigError(-1, 1, 0, "dataset size must be >= 0, got -1");
}

}  // namespace
}  // namespace ddp::sampler
