// The loader: batches equal to gatherBatch's, in plan order, for any number of threads; errors
// reach the consumer; augmentation follows torchvision's definitions and is reproducible.
#include "worker/data/batch_loader.h"

#include <ATen/ops/arange.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker/data/augment.h"

namespace ddp::worker::data {
namespace {

TensorDataset images(int64_t n) {
  TensorDataset ds;
  ds.images = at::arange(n * 2 * 6 * 6, at::kLong).mul(7).remainder(256).to(at::kByte).reshape({n, 2, 6, 6});
  ds.labels = at::arange(n, at::kLong).remainder(10);
  ds.mean = {0.5f, 0.25f};
  ds.stddev = {0.2f, 0.3f};
  return ds;
}

std::vector<std::vector<int64_t>> plan(int64_t batches, int64_t size, int64_t n) {
  std::vector<std::vector<int64_t>> p;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> rows;
    for (int64_t k = 0; k < size; ++k) rows.push_back((b * 37 + k * 11) % n);  // scattered, repeats allowed
    p.push_back(rows);
  }
  return p;
}

TEST(BatchLoader, SameBatchesInPlanOrderForZeroOneAndThreeThreads) {
  const TensorDataset ds = images(50);
  const auto p = plan(23, 8, 50);
  for (int workers : {0, 1, 3}) {
    for (int prefetch : {1, 4}) {
      LoaderOptions o;
      o.numWorkers = workers;
      o.prefetchBatches = prefetch;
      o.pinMemory = true;  // on the CPU: nothing to pin, same batches
      BatchLoader loader(ds, p, o);
      ASSERT_EQ(loader.size(), p.size());
      for (size_t i = 0; i < p.size(); ++i) {
        const Batch got = loader.next();
        const Batch want = gatherBatch(ds, p[i]);
        ASSERT_TRUE(got.images.equal(want.images)) << workers << " threads, batch " << i;
        ASSERT_TRUE(got.labels.equal(want.labels)) << workers << " threads, batch " << i;
      }
      EXPECT_THROW(loader.next(), Error);
    }
  }
}

TEST(BatchLoader, ContiguousBatchesCoverTheRangeOnce) {
  EXPECT_EQ(contiguousBatches(3, 10, 3), (std::vector<std::vector<int64_t>>{{3, 4, 5}, {6, 7, 8}, {9}}));
  EXPECT_TRUE(contiguousBatches(5, 5, 4).empty());
  EXPECT_EQ(contiguousBatches(0, 2, 100), (std::vector<std::vector<int64_t>>{{0, 1}}));
}

TEST(BatchLoader, StoppingEarlyJoinsTheThreads) {
  const TensorDataset ds = images(50);
  LoaderOptions o;
  o.numWorkers = 3;
  BatchLoader loader(ds, plan(100, 4, 50), o);
  loader.next();
  // The destructor stops the threads; reaching the end of this test without a hang is the check,
  // and ThreadSanitizer-free: the threads wait on the consumer, never on a sleep.
}

TEST(BatchLoader, ABadBatchIsTheConsumersErrorAtThatBatch) {
  const TensorDataset ds = images(10);
  auto p = plan(5, 2, 10);
  p[3] = {1, 99};
  for (int workers : {0, 2}) {
    LoaderOptions o;
    o.numWorkers = workers;
    BatchLoader loader(ds, p, o);
    for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(loader.next());
    try {
      loader.next();
      FAIL() << "no DataError";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("index 99 (position 1) is outside the dataset [0, 10)"), std::string::npos);
    }
  }
}

TEST(BatchLoader, AugmentedBatchesDependOnSeedEpochAndSampleOnly) {
  const TensorDataset ds = images(40);
  const auto p = plan(9, 6, 40);
  LoaderOptions o;
  o.augment.rotateDegrees = 15;
  o.augment.cropPadding = 2;
  o.augment.horizontalFlip = true;
  o.seed = 3;
  o.epoch = 1;
  std::vector<Batch> reference;
  {
    BatchLoader loader(ds, p, o);
    for (size_t i = 0; i < p.size(); ++i) reference.push_back(loader.next());
  }
  o.numWorkers = 3;
  BatchLoader threaded(ds, p, o);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(threaded.next().images.equal(reference[i].images)) << i;
  // A sample's augmentation is its own: sample 5 alone, in any batch, looks the same.
  o.numWorkers = 0;
  BatchLoader single(ds, {{5}, {5, 6}}, o);
  const Batch a = single.next(), b = single.next();
  EXPECT_TRUE(a.images[0].equal(b.images[0]));
  EXPECT_FALSE(a.images[0].equal(gatherBatch(ds, {5}).images[0])) << "augmentation changed nothing";
  o.epoch = 2;
  BatchLoader nextEpoch(ds, {{5}}, o);
  EXPECT_FALSE(nextEpoch.next().images[0].equal(a.images[0])) << "a new epoch draws anew";
}

TEST(Augment, FlipAndCropFollowTorchvisionsDefinitions) {
  // One channel 4x4, values 1..16.
  std::vector<uint8_t> in(16);
  for (int i = 0; i < 16; ++i) in[static_cast<size_t>(i)] = static_cast<uint8_t>(i + 1);
  std::vector<uint8_t> out(16);
  // Over many samples a flip-only augmentation gives exactly the image or its mirror, both often.
  AugmentOptions flip;
  flip.horizontalFlip = true;
  int mirrored = 0;
  for (int64_t sample = 0; sample < 200; ++sample) {
    augmentImage(in.data(), out.data(), 1, 4, 4, flip, 0, 0, sample);
    bool same = true, mirror = true;
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 4; ++x) {
        same &= out[static_cast<size_t>(y * 4 + x)] == in[static_cast<size_t>(y * 4 + x)];
        mirror &= out[static_cast<size_t>(y * 4 + x)] == in[static_cast<size_t>(y * 4 + 3 - x)];
      }
    }
    ASSERT_TRUE(same || mirror) << sample;
    mirrored += mirror ? 1 : 0;
  }
  EXPECT_GT(mirrored, 70);
  EXPECT_LT(mirrored, 130);
  // Crop with padding p: the output is the input shifted by (dy, dx) in [-p, p], zeros coming in.
  AugmentOptions crop;
  crop.cropPadding = 1;
  std::vector<int> seen(9, 0);
  for (int64_t sample = 0; sample < 300; ++sample) {
    augmentImage(in.data(), out.data(), 1, 4, 4, crop, 9, 0, sample);
    int matches = 0;
    for (int dy = -1; dy <= 1; ++dy) {
      for (int dx = -1; dx <= 1; ++dx) {
        bool ok = true;
        for (int y = 0; y < 4; ++y) {
          for (int x = 0; x < 4; ++x) {
            const int sy = y + dy, sx = x + dx;
            const uint8_t want = sy < 0 || sy > 3 || sx < 0 || sx > 3 ? 0 : in[static_cast<size_t>(sy * 4 + sx)];
            ok &= out[static_cast<size_t>(y * 4 + x)] == want;
          }
        }
        if (ok) {
          ++matches;
          ++seen[static_cast<size_t>((dy + 1) * 3 + dx + 1)];
        }
      }
    }
    ASSERT_EQ(matches, 1) << sample;
  }
  for (int s : seen) EXPECT_GT(s, 10) << "every offset of the 3x3 window is drawn";
}

TEST(Augment, RotationByNinetyDegreesIsExactAndCounterClockwise) {
  std::vector<uint8_t> in(25), out(25);
  for (int i = 0; i < 25; ++i) in[static_cast<size_t>(i)] = static_cast<uint8_t>(10 * i % 251);
  rotateImage(in.data(), out.data(), 5, 5, 90);
  // Counter-clockwise by 90 degrees: out[y][x] = in[x][w-1-y] (the top-right corner goes top-left).
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 5; ++x) {
      EXPECT_EQ(out[static_cast<size_t>(y * 5 + x)], in[static_cast<size_t>(x * 5 + 4 - y)]) << y << "," << x;
    }
  }
  rotateImage(in.data(), out.data(), 5, 5, 0);
  EXPECT_EQ(out, in);
  // 45 degrees about the centre: the centre stays; the corner (0, 0) samples the source point
  // (-0.83, 2) (y, x), 17% of the way from the zero row above to in[0][2]: bilinear, rounded.
  rotateImage(in.data(), out.data(), 5, 5, 45);
  EXPECT_EQ(out[12], in[12]);
  const double t = 2.0 - 2.0 * std::sqrt(2.0);  // sy = -0.828...
  EXPECT_EQ(out[0], static_cast<uint8_t>(std::lround((1 + t) * in[2])));
}

}  // namespace
}  // namespace ddp::worker::data
