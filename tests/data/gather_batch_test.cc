#include "worker/data/gather_batch.h"

#include <ATen/ops/arange.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace ddp::data {
namespace {

TEST(GatherBatch, TakesRowsInIndexOrder) {
  const at::Tensor t = at::arange(24, at::kFloat).reshape({6, 2, 2});
  const std::vector<int64_t> idx = {5, 0, 5, 2};
  const at::Tensor b = gatherBatch(t, idx);
  ASSERT_EQ(b.sizes(), (std::vector<int64_t>{4, 2, 2}));
  for (size_t i = 0; i < idx.size(); ++i) {
    EXPECT_TRUE(b[static_cast<int64_t>(i)].equal(t[idx[i]])) << "row " << i;
  }
  EXPECT_EQ(gatherBatch(t, {}).sizes(), (std::vector<int64_t>{0, 2, 2}));
}

TEST(GatherBatch, DatasetOverloadKeepsImagesAndLabelsTogether) {
  TensorDataset ds;
  ds.images = at::arange(10, at::kFloat).reshape({5, 1, 1, 2});
  ds.labels = at::arange(5, at::kLong);
  const Batch batch = gatherBatch(ds, {3, 1});
  EXPECT_EQ(batch.labels[0].item<int64_t>(), 3);
  EXPECT_EQ(batch.labels[1].item<int64_t>(), 1);
  EXPECT_EQ(batch.images[0].flatten()[0].item<float>(), 6.0f);
  EXPECT_EQ(batch.images[1].flatten()[1].item<float>(), 3.0f);
}

TEST(GatherBatch, OutOfRangeIndexIsNamed) {
  const at::Tensor t = at::arange(4, at::kLong);
  try {
    gatherBatch(t, {1, 4});
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("index 4 (position 1) is outside the dataset [0, 4)"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(gatherBatch(t, {-1}), DataError);
}

}  // namespace
}  // namespace ddp::data
