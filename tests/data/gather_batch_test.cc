#include "worker/data/gather_batch.h"

#include <ATen/ops/arange.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace ddp::worker::data {
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

TEST(GatherBatch, Uint8ImagesAreNormalisedPerChannelAsToTensorAndNormalize) {
  TensorDataset ds;
  // 4 samples, 3 channels of 2x2: every byte value 0..255 appears somewhere.
  ds.images = at::arange(48, at::kLong).mul(37).remainder(256).to(at::kByte).reshape({4, 3, 2, 2});
  ds.labels = at::arange(4, at::kLong);
  ds.mean = {0.485f, 0.456f, 0.406f};
  ds.stddev = {0.229f, 0.224f, 0.225f};
  const Batch batch = gatherBatch(ds, {2, 0});
  ASSERT_EQ(batch.images.scalar_type(), at::kFloat);
  ASSERT_EQ(batch.images.sizes(), (std::vector<int64_t>{2, 3, 2, 2}));
  const int64_t rows[] = {2, 0};
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t p = 0; p < 4; ++p) {
        const auto byte = ds.images[rows[i]][c].flatten()[p].item<uint8_t>();
        // torchvision: ToTensor divides by 255 in float32, Normalize subtracts and divides.
        const float expected = (static_cast<float>(byte) / 255.0f - ds.mean[c]) / ds.stddev[c];
        EXPECT_EQ(batch.images[i][c].flatten()[p].item<float>(), expected) << i << "," << c << "," << p;
      }
    }
  }
  EXPECT_TRUE(sliceBatch(ds, 2, 1).images[0].equal(batch.images[0]));
  EXPECT_TRUE(sliceBatch(ds, 1, 2).labels.equal(at::arange(1, 3, at::kLong)));
}

TEST(GatherBatch, FloatImagesAreModelInputAsTheyAre) {
  TensorDataset ds;
  ds.images = at::arange(8, at::kFloat).reshape({4, 2});
  ds.labels = at::arange(4, at::kLong);
  EXPECT_TRUE(sliceBatch(ds, 1, 2).images.equal(ds.images.narrow(0, 1, 2)));
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
}  // namespace ddp::worker::data
