// data.name: tensors — files Python writes with torch.save({"x": ..., "y": ...}); every value we
// read is checked against what Python reports about the same file (tests/python/make_tensor_data.py).
#include "worker/data/tensor_files.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "worker/data/gather_batch.h"

namespace ddp::worker::data {
namespace {

namespace fs = std::filesystem;

class TensorFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((fs::temp_directory_path() / ("ddp_tensor_files_" + std::to_string(::getpid()))).string());
    fs::create_directories(*dir_);
    const std::string command = std::string(DDP_PYTHON) + " " DDP_SOURCE_DIR "/tests/python/make_tensor_data.py " + *dir_;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    std::ifstream in(*dir_ + "/reference.json");
    reference_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete reference_;
  }
  static std::string path(const std::string& name) { return *dir_ + "/" + name + ".pt"; }

  // Labels, sums and leading values equal Python's; the model input is x (float) or x / 255 (uint8).
  static void check(const std::string& name) {
    SCOPED_TRACE(name);
    const nlohmann::json& ref = reference_->at(name);
    const TensorDataset ds = loadTensorFile(path(name), "data.train_file");
    const auto shape = ref.at("x_shape").get<std::vector<int64_t>>();
    ASSERT_EQ(ds.size(), shape[0]);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    EXPECT_EQ(ds.images.numel(), numel);
    EXPECT_EQ(ds.images.dim(), 4);
    EXPECT_EQ(ds.labels.scalar_type(), at::kLong);
    const auto first = ref.at("y_first").get<std::vector<int64_t>>();
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(ds.labels[static_cast<int64_t>(i)].item<int64_t>(), first[i]);
    EXPECT_EQ(ds.labels.sum().item<int64_t>(), ref.at("y_sum").get<int64_t>());
    const bool bytes = ref.at("x_dtype") == "torch.uint8";
    EXPECT_EQ(ds.images.scalar_type(), bytes ? at::kByte : at::kFloat);
    const double sum = ds.images.to(at::kDouble).sum().item<double>();
    EXPECT_NEAR(sum, ref.at("x_sum").get<double>(), 1e-6 * (1 + std::abs(ref.at("x_sum").get<double>())) + (bytes ? 0 : 1e-3));
    const at::Tensor input = modelInput(ds, ds.images).flatten();
    const auto values = ref.at("x_first").get<std::vector<double>>();
    for (size_t i = 0; i < values.size(); ++i) {
      const float expected = bytes ? static_cast<float>(values[i]) / 255.0f : static_cast<float>(values[i]);
      EXPECT_EQ(input[static_cast<int64_t>(i)].item<float>(), expected) << "value " << i;
    }
  }

  static std::string errorOf(const std::string& name) {
    try {
      loadTensorFile(path(name), "data.train_file");
    } catch (const DataError& e) {
      return e.what();
    }
    return "<no DataError>";
  }

  static std::string* dir_;
  static nlohmann::json* reference_;
};
std::string* TensorFiles::dir_ = nullptr;
nlohmann::json* TensorFiles::reference_ = nullptr;

TEST_F(TensorFiles, FloatBytesAndFeatureFilesReadAsPythonWroteThem) {
  for (const std::string name : {"float_train", "float_test", "bytes_train", "bytes_test", "features_train"}) check(name);
  const TensorDataset features = loadTensorFile(path("features_train"), "data.train_file");
  EXPECT_EQ(features.images.sizes(), (std::vector<int64_t>{64, 1, 1, 20})) << "[N, F] is kept as [N, 1, 1, F]";
  const TensorDataset bytes = loadTensorFile(path("bytes_train"), "data.train_file");
  EXPECT_EQ(bytes.mean, (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(bytes.stddev, (std::vector<float>{1, 1, 1}));
}

TEST_F(TensorFiles, BadFilesAreOneLineNamingTheKeyAndTheFix) {
  EXPECT_NE(errorOf("mismatch").find("x holds 10 samples but y holds 9 labels"), std::string::npos) << errorOf("mismatch");
  EXPECT_NE(errorOf("float_labels").find("give class ids as a 1-D integer tensor"), std::string::npos)
      << errorOf("float_labels");
  EXPECT_NE(errorOf("list").find("holds a list, not a dict of tensors; save a dict (Python: torch.save("),
            std::string::npos) << errorOf("list");
  EXPECT_NE(errorOf("list").find("torch.save({\"x\": images, \"y\": labels}, path)"), std::string::npos) << errorOf("list");
  const std::string missing = errorOf("nope");
  EXPECT_EQ(missing.rfind("data: data.train_file: ", 0), 0u) << missing;
  EXPECT_NE(missing.find("nope.pt"), std::string::npos) << missing;
  for (const std::string name : {"mismatch", "float_labels", "list", "nope"}) {
    EXPECT_EQ(errorOf(name).find('\n'), std::string::npos) << "one line: " << errorOf(name);
  }
}

}  // namespace
}  // namespace ddp::worker::data
