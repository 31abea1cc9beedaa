#include "sampler/batching.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace ddp::sampler {
namespace {

using Batches = std::vector<std::vector<int64_t>>;

TEST(Batching, KeepsShortLastBatchUnlessDropLast) {
  const std::vector<int64_t> idx = {5, 3, 9, 1, 0, 7, 2};
  EXPECT_EQ(makeBatches(idx, 3, false), (Batches{{5, 3, 9}, {1, 0, 7}, {2}}));
  EXPECT_EQ(makeBatches(idx, 3, true), (Batches{{5, 3, 9}, {1, 0, 7}}));
  EXPECT_EQ(makeBatches(idx, 7, true), (Batches{idx}));
  EXPECT_EQ(makeBatches(idx, 8, false), (Batches{idx}));
  EXPECT_TRUE(makeBatches(idx, 8, true).empty());
  EXPECT_TRUE(makeBatches({}, 4, false).empty());
}

TEST(Batching, CountMatchesBatches) {
  std::vector<int64_t> idx;
  for (int64_t n = 0; n < 20; ++n) {
    for (int64_t bs = 1; bs < 9; ++bs) {
      for (bool dropLast : {false, true}) {
        EXPECT_EQ(numBatches(n, bs, dropLast),
                  static_cast<int64_t>(makeBatches(idx, bs, dropLast).size()));
      }
    }
    idx.push_back(n);
  }
}

TEST(Batching, RejectsNonPositiveBatchSize) {
  EXPECT_THROW(makeBatches({1, 2}, 0, false), ConfigError);
  EXPECT_THROW(numBatches(3, -2, true), ConfigError);
  EXPECT_THROW(numBatches(-1, 2, true), ConfigError);
}

}  // namespace
}  // namespace ddp::sampler
