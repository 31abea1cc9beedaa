// One copy of the data per host: ranks (threads here, over a real c10d store) elect one loader,
// the others map its copy; a loader's failure reaches every rank as the same one-line error.
#include "worker/data/datasets.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "ddp/image_data.h"
#include "libddp/internal.h"
#include "worker/data/gather_batch.h"
#include "worker/data/streamed_images.h"

namespace ddp::worker {
namespace {

using namespace std::chrono_literals;

DataConfig synthetic() {
  DataConfig c;
  c.name = "synthetic";
  c.syntheticTrain = 300;
  c.syntheticTest = 50;
  c.trainLimit = 200;
  return c;
}

struct RankResult {
  Datasets data;
  DataOrigin origin = DataOrigin::kLoaded;
  std::string error;
  bool dataError = false;
};

std::vector<RankResult> loadOnRanks(const DataConfig& config, int ranks) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankResult> results(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto& out = results[static_cast<size_t>(r)];
      try {
        GroupStart::Impl start;  // the ranks of one host, met at `store`
        start.rank = r;
        start.size = ranks;
        start.localRank = r;
        start.localSize = ranks;
        start.timeout = 30s;
        start.store = store;
        out.data = loadDatasetsOncePerHost(config, 7, GroupStart(start), Splits::kTrainAndEval, &out.origin);
      } catch (const DataError& e) {
        out.error = e.what();
        out.dataError = true;
      } catch (const std::exception& e) {
        out.error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// The evaluation split of an ImageFolder root: val/ (torchvision's ImageNet), else test/; with both
// val/ (an ImageNet copy may carry an unlabelled test/); with neither one line naming both.
TEST(ImageFolderLayout, ValIsEvaluatedBeforeTestAndNeitherIsOneLine) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("ddp_eval_dir_" + std::to_string(::getpid()));
  fs::create_directories(root / "train");
  EXPECT_THROW(
      {
        try {
          ddp::worker::data::imageFolderEvalDir(root.string());
        } catch (const ddp::DataError& e) {
          EXPECT_NE(std::string(e.what()).find("has no val/ (or test/) folder"), std::string::npos) << e.what();
          throw;
        }
      },
      ddp::DataError);
  fs::create_directories(root / "test");
  EXPECT_EQ(ddp::worker::data::imageFolderEvalDir(root.string()), (root / "test").string());
  fs::create_directories(root / "val");
  EXPECT_EQ(ddp::worker::data::imageFolderEvalDir(root.string()), (root / "val").string());
  fs::remove_all(root);
}

// The worker's config header keeps the library's image headers out, so it repeats the limit.
TEST(ImageDecodeLimit, TheConfigsDefaultIsTheLibrarys) {
  EXPECT_EQ(DataConfig{}.maxImagePixels, ddp::kMaxImagePixels);
}

TEST(OneCopyPerHost, OneRankLoadsTheOthersMapItsCopy) {
  const DataConfig config = synthetic();
  const Datasets reference = loadDatasets(config, 7);
  ASSERT_EQ(reference.train.size(), 200);
  const auto results = loadOnRanks(config, 4);
  std::multiset<DataOrigin> origins;
  for (const auto& r : results) {
    ASSERT_EQ(r.error, "");
    origins.insert(r.origin);
    EXPECT_TRUE(r.data.train.images.equal(reference.train.images));
    EXPECT_TRUE(r.data.train.labels.equal(reference.train.labels));
    EXPECT_TRUE(r.data.test.images.equal(reference.test.images));
    EXPECT_TRUE(r.data.test.labels.equal(reference.test.labels));
    EXPECT_EQ(r.data.input.channels, reference.input.channels);
    EXPECT_EQ(r.data.input.classes, reference.input.classes);
  }
  EXPECT_EQ(origins.count(DataOrigin::kSharedByThisRank), 1u);
  EXPECT_EQ(origins.count(DataOrigin::kMappedFromHostCopy), 3u);
  // The mapped ranks read the loader's pages: same bytes, no copy of their own.
  const RankResult* loader = nullptr;
  for (const auto& r : results) {
    if (r.origin == DataOrigin::kSharedByThisRank) loader = &r;
  }
  ASSERT_NE(loader, nullptr);
  for (const auto& r : results) {
    if (&r != loader) EXPECT_NE(r.data.train.images.data_ptr(), loader->data.train.images.data_ptr());
  }
}

TEST(OneCopyPerHost, FashionMnistKeepsItsNormalisationThroughTheCopy) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(root + "/t10k-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Debian package dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  }
  DataConfig config;
  config.root = root;
  const Datasets reference = loadDatasets(config, 0);
  const auto results = loadOnRanks(config, 2);
  for (const auto& r : results) {
    ASSERT_EQ(r.error, "");
    EXPECT_EQ(r.data.train.images.scalar_type(), at::kByte);
    EXPECT_EQ(r.data.test.mean, reference.test.mean);
    EXPECT_EQ(r.data.test.stddev, reference.test.stddev);
    const std::vector<int64_t> rows = {0, 59999, 12345};
    EXPECT_TRUE(data::gatherBatch(r.data.train, rows).images.equal(data::gatherBatch(reference.train, rows).images));
  }
}

TEST(OneCopyPerHost, TheLoadersFailureIsEveryRanksError) {
  DataConfig config;
  config.root = "/nonexistent/fashion-mnist";
  const auto results = loadOnRanks(config, 3);
  for (const auto& r : results) {
    EXPECT_TRUE(r.dataError) << r.error;
    EXPECT_NE(r.error.find("/nonexistent/fashion-mnist is not a directory"), std::string::npos) << r.error;
    EXPECT_EQ(r.error, results[0].error);
  }
}

}  // namespace
}  // namespace ddp::worker
