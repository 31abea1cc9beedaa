// Tier 1: bucket layout by formula (DDP's compute_bucket_assignment_by_size
// over reversed parameters).
#include <gtest/gtest.h>

#include <ATen/ops/zeros.h>

#include "libddp/engine/bucket_assignment.h"

namespace ddp::engine {
namespace {

using Buckets = std::vector<std::vector<size_t>>;

std::vector<at::Tensor> floats(const std::vector<int64_t>& numels) {
  std::vector<at::Tensor> out;
  for (int64_t n : numels) out.push_back(at::zeros({n}));
  return out;
}

TEST(BucketAssignment, ReverseOrderSmallFirstBucketThenCap) {
  // 400, 800, 1200, 1600 bytes; first cap 1000, then 2000.
  // Reversed: [3]=1600 ≥ 1000 closes; [2]+[1]=2000 ≥ 2000 closes; [0] is left over.
  EXPECT_EQ(assignBuckets(floats({100, 200, 300, 400}), 1000, 2000), (Buckets{{3}, {2, 1}, {0}}));
}

TEST(BucketAssignment, DefaultCapsPutASmallModelInOneBucket) {
  EXPECT_EQ(assignBuckets(floats({10, 20, 30}), 1u << 20, 25u << 20), (Buckets{{2, 1, 0}}));
}

TEST(BucketAssignment, TinyCapsGiveOneBucketPerParameter) {
  EXPECT_EQ(assignBuckets(floats({5, 6, 7}), 1, 1), (Buckets{{2}, {1}, {0}}));
}

TEST(BucketAssignment, LargeModelFirstBucketIsAboutOneMebibyte) {
  // MLP 784-512-256-10 in registration order: w1 b1 w2 b2 w3 b3.
  const auto params = floats({512 * 784, 512, 256 * 512, 256, 10 * 256, 10});
  const auto buckets = assignBuckets(params, 1u << 20, 25u << 20);
  // Reversed sizes: b3 40 B, w3 10 KiB, b2 1 KiB, w2 512 KiB, b1 2 KiB, w1 1.53 MiB:
  // the first bucket closes only after w1 (running total ≥ 1 MiB).
  EXPECT_EQ(buckets, (Buckets{{5, 4, 3, 2, 1, 0}}));
  const auto many = assignBuckets(params, 600u << 10, 1u << 20);
  // 40+10240+1024+524288 = 535592 < 600 KiB; + b1 (2048) still < 614400; + w1 closes it.
  EXPECT_EQ(many, (Buckets{{5, 4, 3, 2, 1, 0}}));
  EXPECT_EQ(assignBuckets(params, 512u << 10, 1u << 20), (Buckets{{5, 4, 3, 2}, {1, 0}}));
}

TEST(BucketAssignment, DtypesNeverShareABucket) {
  std::vector<at::Tensor> params = {at::zeros({4}), at::zeros({4}, at::kDouble), at::zeros({4})};
  const auto buckets = assignBuckets(params, 1u << 20, 25u << 20);
  EXPECT_EQ(buckets, (Buckets{{2, 0}, {1}}));
}

}  // namespace
}  // namespace ddp::engine
