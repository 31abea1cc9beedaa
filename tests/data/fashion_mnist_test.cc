// loadFashionMnist on the real files of Debian's dataset-fashion-mnist, checked
// against values Python computes from the same files (fashion_mnist_reference.py),
// and on small hand-made files that are missing, corrupt or truncated.
#include "worker/data/fashion_mnist.h"
#include "worker/data/gather_batch.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/support/run_command.h"

namespace ddp::worker::data {
namespace {

namespace fs = std::filesystem;

std::string realRoot() {
  const char* env = std::getenv("DDP_FASHION_MNIST_ROOT");
  return env != nullptr ? env : kFashionMnistDefaultRoot;
}

// ---- the real data set, against Python ----

class FashionMnistReal : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto reference = test::runCommand(
        {DDP_PYTHON, DDP_SOURCE_DIR "/tests/data/fashion_mnist_reference.py", realRoot()}, test::stdoutOnly());
    EXPECT_EQ(reference.exitCode, 0) << "fashion_mnist_reference.py " << realRoot() << " failed";
    const std::string& out = reference.output;
    reference_ = new nlohmann::json(nlohmann::json::parse(out));
    train_ = new TensorDataset(loadFashionMnist(realRoot(), Split::kTrain));
    test_ = new TensorDataset(loadFashionMnist(realRoot(), Split::kTest));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete train_;
    delete test_;
  }

  static void checkSplit(const TensorDataset& ds, const nlohmann::json& ref, int64_t count) {
    ASSERT_EQ(ref.at("count").get<int64_t>(), count);
    ASSERT_EQ(ds.size(), count);
    EXPECT_EQ(ds.images.sizes(), (std::vector<int64_t>{count, 1, 28, 28}));
    EXPECT_EQ(ds.images.scalar_type(), at::kByte);  // raw pixels; batches are normalised
    EXPECT_EQ(ds.mean, std::vector<float>{kFashionMnistMean});
    EXPECT_EQ(ds.stddev, std::vector<float>{kFashionMnistStd});
    EXPECT_EQ(ds.labels.sizes(), (std::vector<int64_t>{count}));
    EXPECT_EQ(ds.labels.scalar_type(), at::kLong);
    EXPECT_TRUE(ds.images.is_contiguous());

    const int64_t* labels = ds.labels.data_ptr<int64_t>();
    std::vector<int64_t> histogram(10, 0);
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_GE(labels[i], 0);
      ASSERT_LT(labels[i], 10);
      ++histogram[static_cast<size_t>(labels[i])];
    }
    EXPECT_EQ(histogram, ref.at("label_histogram").get<std::vector<int64_t>>());
    const auto first = ref.at("first_labels").get<std::vector<int64_t>>();
    EXPECT_EQ(std::vector<int64_t>(labels, labels + first.size()), first);

    // The bytes as stored; their sum must be Python's.
    const uint8_t* raw = ds.images.data_ptr<uint8_t>();
    int64_t rawSum = 0;
    for (int64_t i = 0; i < ds.images.numel(); ++i) rawSum += raw[i];
    // What the model sees: the whole split normalised as batches are.
    const at::Tensor input = modelInput(ds, ds.images);
    ASSERT_EQ(input.scalar_type(), at::kFloat);
    const float* px = input.data_ptr<float>();
    double normalisedSum = 0;
    for (int64_t i = 0; i < input.numel(); ++i) normalisedSum += px[i];
    EXPECT_EQ(rawSum, ref.at("raw_pixel_sum").get<int64_t>());
    const double mean = normalisedSum / static_cast<double>(input.numel());
    const double rawMean = ref.at("raw_pixel_mean").get<double>();
    EXPECT_NEAR(mean, (rawMean / 255.0 - 0.2860) / 0.3530, 1e-5);
    EXPECT_NEAR(mean, ref.at("normalised_mean").get<double>(), 1e-6);

    // Bit-identical to torchvision's ToTensor + Normalize on the same bytes.
    for (const auto& [key, values] : ref.at("samples").items()) {
      const int64_t index = std::stoll(key);
      const auto expected = values.get<std::vector<double>>();
      ASSERT_EQ(expected.size(), 784u);
      const float* image = px + index * 784;
      for (size_t j = 0; j < expected.size(); ++j) {
        ASSERT_EQ(static_cast<double>(image[j]), expected[j]) << "image " << index << " pixel " << j;
      }
    }
  }

  static nlohmann::json* reference_;
  static TensorDataset* train_;
  static TensorDataset* test_;
};

nlohmann::json* FashionMnistReal::reference_ = nullptr;
TensorDataset* FashionMnistReal::train_ = nullptr;
TensorDataset* FashionMnistReal::test_ = nullptr;

TEST_F(FashionMnistReal, TrainSplitMatchesPython) { checkSplit(*train_, reference_->at("train"), 60000); }

TEST_F(FashionMnistReal, TestSplitMatchesPython) { checkSplit(*test_, reference_->at("test"), 10000); }

// ---- hand-made files ----

class FashionMnistFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ddp_fmnist_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::vector<uint8_t> idx(uint32_t magic, const std::vector<uint32_t>& dims,
                                  const std::vector<uint8_t>& data) {
    std::vector<uint8_t> bytes;
    auto put = [&](uint32_t v) {
      for (int shift = 24; shift >= 0; shift -= 8) {
        bytes.push_back(static_cast<uint8_t>(v >> shift));
      }
    };
    put(magic);
    for (uint32_t d : dims) {
      put(d);
    }
    bytes.insert(bytes.end(), data.begin(), data.end());
    return bytes;
  }

  void write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const std::string path = (dir_ / name).string();
    if (name.size() > 3 && name.substr(name.size() - 3) == ".gz") {
      gzFile f = gzopen(path.c_str(), "wb");
      ASSERT_NE(f, nullptr);
      ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
      ASSERT_EQ(gzclose(f), Z_OK);
    } else {
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
  }

  // A valid test split of `n` images whose pixel k of image i is (i * 784 + k) % 256.
  void writeTestSplit(int64_t n, const std::string& suffix) const {
    std::vector<uint8_t> pixels(static_cast<size_t>(n) * 784);
    for (size_t k = 0; k < pixels.size(); ++k) {
      pixels[k] = static_cast<uint8_t>(k % 256);
    }
    std::vector<uint8_t> labels;
    for (int64_t i = 0; i < n; ++i) {
      labels.push_back(static_cast<uint8_t>((i * 7) % 10));
    }
    write("t10k-images-idx3-ubyte" + suffix, idx(2051, {static_cast<uint32_t>(n), 28, 28}, pixels));
    write("t10k-labels-idx1-ubyte" + suffix, idx(2049, {static_cast<uint32_t>(n)}, labels));
  }

  // The DataError message loading the test split from dir_ raises.
  std::string loadError() const {
    try {
      loadFashionMnist(dir_.string(), Split::kTest);
    } catch (const DataError& e) {
      return e.what();
    }
    ADD_FAILURE() << "loading " << dir_ << " did not throw DataError";
    return {};
  }

  fs::path dir_;
};

TEST_F(FashionMnistFiles, ReadsGzippedAndPlainFilesAlike) {
  for (const std::string suffix : {".gz", ""}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    writeTestSplit(3, suffix);
    const TensorDataset ds = loadFashionMnist(dir_.string(), Split::kTest);
    ASSERT_EQ(ds.size(), 3);
    EXPECT_EQ(ds.images.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
    const int64_t* labels = ds.labels.data_ptr<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(labels, labels + 3), (std::vector<int64_t>{0, 7, 4}));
    const at::Tensor input = sliceBatch(ds, 0, 3).images;
    const float* px = input.data_ptr<float>();
    for (int64_t k = 0; k < 3 * 784; ++k) {
      const float expected = (static_cast<float>(k % 256) / 255.0f - 0.2860f) / 0.3530f;
      ASSERT_EQ(px[k], expected) << "pixel " << k << " suffix '" << suffix << "'";
    }
  }
}

TEST_F(FashionMnistFiles, MissingRootNamesPathAndFix) {
  const std::string root = (dir_ / "no-such-dir").string();
  try {
    loadFashionMnist(root, Split::kTrain);
    FAIL() << "no DataError";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(root), std::string::npos) << msg;
    EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
  }
}

TEST_F(FashionMnistFiles, MissingFileNamesIt) {
  writeTestSplit(2, ".gz");
  fs::remove(dir_ / "t10k-labels-idx1-ubyte.gz");
  const std::string msg = loadError();
  EXPECT_NE(msg.find((dir_ / "t10k-labels-idx1-ubyte.gz").string() + " not found"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("install Debian package dataset-fashion-mnist or set data.root"),
            std::string::npos) << msg;
}

TEST_F(FashionMnistFiles, BadMagicIsNamed) {
  writeTestSplit(2, ".gz");
  write("t10k-images-idx3-ubyte.gz", idx(2049, {2, 28, 28}, std::vector<uint8_t>(2 * 784)));
  const std::string msg = loadError();
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte.gz: bad magic number 2049 (expected 2051"),
            std::string::npos) << msg;
}

TEST_F(FashionMnistFiles, TruncatedDataIsReported) {
  writeTestSplit(2, "");
  write("t10k-images-idx3-ubyte", idx(2051, {2, 28, 28}, std::vector<uint8_t>(784 + 100)));
  const std::string msg = loadError();
  EXPECT_NE(msg.find("truncated: the header promises 1568 data bytes but the file holds 884"),
            std::string::npos) << msg;
}

TEST_F(FashionMnistFiles, TruncatedGzipStreamIsReported) {
  writeTestSplit(20, ".gz");
  const fs::path images = dir_ / "t10k-images-idx3-ubyte.gz";
  fs::resize_file(images, fs::file_size(images) / 2);
  const std::string msg = loadError();
  EXPECT_NE(msg.find(images.string()), std::string::npos) << msg;
}

TEST_F(FashionMnistFiles, CorruptGzipStreamIsReported) {
  writeTestSplit(20, ".gz");
  const fs::path images = dir_ / "t10k-images-idx3-ubyte.gz";
  {
    std::fstream f(images, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(images) / 2));
    f.write("\xde\xad\xbe\xef\xde\xad\xbe\xef", 8);
  }
  const std::string msg = loadError();
  EXPECT_NE(msg.find("fashion-mnist: " + images.string() + ": "), std::string::npos) << msg;
}

TEST_F(FashionMnistFiles, TruncatedHeaderIsReported) {
  writeTestSplit(2, ".gz");
  write("t10k-labels-idx1-ubyte.gz", {0, 0, 8});
  EXPECT_NE(loadError().find("too short for an idx header"), std::string::npos);
}

TEST_F(FashionMnistFiles, CountMismatchIsReported) {
  writeTestSplit(3, ".gz");
  write("t10k-labels-idx1-ubyte.gz", idx(2049, {2}, {1, 2}));
  EXPECT_NE(loadError().find("holds 3 images but"), std::string::npos);
}

TEST_F(FashionMnistFiles, TrailingBytesAreReported) {
  writeTestSplit(2, ".gz");
  write("t10k-labels-idx1-ubyte.gz", idx(2049, {2}, {1, 2, 3}));
  EXPECT_NE(loadError().find("trailing bytes"), std::string::npos);
}

TEST_F(FashionMnistFiles, LabelOutOfRangeIsReported) {
  writeTestSplit(2, ".gz");
  write("t10k-labels-idx1-ubyte.gz", idx(2049, {2}, {1, 10}));
  EXPECT_NE(loadError().find("label 10 of sample 1 is outside [0, 10)"), std::string::npos);
}

TEST_F(FashionMnistFiles, ImplausibleHeaderIsRejectedBeforeAllocating) {
  writeTestSplit(2, ".gz");
  write("t10k-images-idx3-ubyte.gz", idx(2051, {0xffffffffu, 0xffffffffu, 28}, {}));
  EXPECT_NE(loadError().find("implausible header dimensions"), std::string::npos);
}

TEST_F(FashionMnistFiles, WrongImageSizeIsReported) {
  writeTestSplit(2, ".gz");
  write("t10k-images-idx3-ubyte.gz", idx(2051, {2, 32, 32}, std::vector<uint8_t>(2 * 1024)));
  EXPECT_NE(loadError().find("images are 32x32, expected 28x28"), std::string::npos);
}

}  // namespace
}  // namespace ddp::worker::data
