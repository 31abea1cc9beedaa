#include "worker/data/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"

namespace ddp::worker::data {
namespace {

TEST(Synthetic, ShapesAndTypes) {
  SyntheticOptions options;
  options.size = 64;
  options.shape = {3, 8, 8};
  options.numClasses = 5;
  const TensorDataset ds = makeSynthetic(options);
  EXPECT_EQ(ds.size(), 64);
  EXPECT_EQ(ds.images.sizes(), (std::vector<int64_t>{64, 3, 8, 8}));
  EXPECT_EQ(ds.images.scalar_type(), at::kFloat);
  EXPECT_EQ(ds.labels.sizes(), (std::vector<int64_t>{64}));
  EXPECT_EQ(ds.labels.scalar_type(), at::kLong);
  EXPECT_GE(ds.labels.min().item<int64_t>(), 0);
  EXPECT_LT(ds.labels.max().item<int64_t>(), 5);
}

TEST(Synthetic, DeterministicPerSeed) {
  SyntheticOptions options;
  options.seed = 3;
  const TensorDataset a = makeSynthetic(options);
  const TensorDataset b = makeSynthetic(options);
  EXPECT_TRUE(a.images.equal(b.images));
  EXPECT_TRUE(a.labels.equal(b.labels));
  options.seed = 4;
  const TensorDataset c = makeSynthetic(options);
  EXPECT_FALSE(a.images.equal(c.images));
  EXPECT_FALSE(a.labels.equal(c.labels));
}

TEST(Synthetic, LabelsFollowTheDocumentedLinearRule) {
  SyntheticOptions options;
  options.size = 200;
  options.seed = 11;
  const TensorDataset ds = makeSynthetic(options);
  // Recomputed from the contract in synthetic.h: argmax(x · W), W ~ N(0,1) from ruleSeed.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.ruleSeed);
  const at::Tensor rule = at::randn({784, 10}, gen, at::kFloat);
  const at::Tensor expected = at::argmax(at::matmul(ds.images.reshape({200, 784}), rule), 1);
  EXPECT_TRUE(ds.labels.equal(expected));
  // A different rule seed labels the same images differently.
  options.ruleSeed = 1;
  EXPECT_FALSE(makeSynthetic(options).labels.equal(ds.labels));
}

TEST(Synthetic, EveryClassIsWellRepresented) {
  SyntheticOptions options;
  options.size = 2000;
  const TensorDataset ds = makeSynthetic(options);
  std::vector<int64_t> histogram(10, 0);
  const int64_t* labels = ds.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < ds.size(); ++i) {
    ++histogram[static_cast<size_t>(labels[i])];
  }
  for (int64_t count : histogram) {
    EXPECT_GT(count, 2000 / 10 / 3);
  }
}

TEST(Synthetic, EmptyAndInvalid) {
  SyntheticOptions options;
  options.size = 0;
  EXPECT_EQ(makeSynthetic(options).size(), 0);
  options.size = -1;
  EXPECT_THROW(makeSynthetic(options), ConfigError);
  options = SyntheticOptions{};
  options.shape = {};
  EXPECT_THROW(makeSynthetic(options), ConfigError);
  options.shape = {1, 0, 28};
  EXPECT_THROW(makeSynthetic(options), ConfigError);
  options = SyntheticOptions{};
  options.numClasses = 0;
  EXPECT_THROW(makeSynthetic(options), ConfigError);
}

}  // namespace
}  // namespace ddp::worker::data
