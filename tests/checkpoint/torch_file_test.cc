// The torch-file reader against files written by Python's torch.save (the
// reference), and against damaged files.
#include <gtest/gtest.h>

#include <ATen/ops/allclose.h>
#include <ATen/ops/tensor.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "libddp/checkpoint/torch_file.h"
#include "tests/support/run_command.h"

namespace ddp::checkpoint {
namespace {

namespace fs = std::filesystem;

class TorchFile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "ddp_torchfile_XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
    manifest_ = nlohmann::ordered_json::parse(
        test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/make_torch_files.py", dir_}, test::stdoutOnly())
            .output);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static void expectMatches(const std::vector<std::pair<std::string, at::Tensor>>& got,
                            const nlohmann::ordered_json& expected) {
    ASSERT_EQ(got.size(), expected.size());
    auto it = expected.begin();
    for (const auto& [key, tensor] : got) {
      EXPECT_EQ(key, it.key()) << "keys must come in file order";
      const auto& e = it.value();
      EXPECT_EQ(std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end()),
                e["shape"].get<std::vector<int64_t>>()) << key;
      const auto values = e["values"].get<std::vector<double>>();
      const at::Tensor flat = tensor.to(at::kDouble).flatten().contiguous();
      ASSERT_EQ(flat.numel(), static_cast<int64_t>(values.size())) << key;
      for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(flat[i].item<double>(), values[i]) << key << "[" << i << "]";
      ++it;
    }
  }

  static inline std::string dir_;
  static inline nlohmann::ordered_json manifest_;
};

TEST_F(TorchFile, ReadsPlainDataParallelAndDdpStateDicts) {
  for (const std::string file : {"plain_state_dict.pt", "dp_state_dict.pt", "ddp_state_dict.pt"}) {
    SCOPED_TRACE(file);
    const auto v = readTorchFile(dir_ + "/" + file);
    ASSERT_EQ(v->kind, PyValue::Kind::kDict);
    EXPECT_TRUE(v->ordered) << "state_dict() is an OrderedDict";
    const auto entries = tensorEntries(*v);
    ASSERT_FALSE(entries.empty());
    expectMatches(entries, manifest_[file]);
    EXPECT_EQ(entries[0].first.rfind("module.", 0) == 0, file != "plain_state_dict.pt") << entries[0].first;
    // BatchNorm's num_batches_tracked is an int64 0-dim tensor.
    const auto tracked = std::find_if(entries.begin(), entries.end(), [](const auto& e) {
      return e.first.find("num_batches_tracked") != std::string::npos;
    });
    ASSERT_NE(tracked, entries.end());
    EXPECT_EQ(tracked->second.scalar_type(), at::kLong);
    EXPECT_EQ(tracked->second.dim(), 0);
  }
}

TEST_F(TorchFile, ReadsANestedCheckpointWithScalars) {
  const auto v = readTorchFile(dir_ + "/checkpoint.pt");
  ASSERT_NE(v->get("model"), nullptr);
  expectMatches(tensorEntries(*v->get("model")), manifest_["checkpoint.pt"]["model"]);
  EXPECT_EQ(v->get("epoch")->integer, 3);
  EXPECT_DOUBLE_EQ(v->get("lr")->real, 0.125);
  EXPECT_EQ(v->get("name")->text, "run-1");
  ASSERT_EQ(v->get("steps")->items.size(), 3u);
  EXPECT_EQ(v->get("steps")->items[2]->integer, 3);
  EXPECT_EQ(v->get("absent"), nullptr);
}

TEST_F(TorchFile, ReadsEveryDtypeViewsAndNonContiguousTensors) {
  const auto v = readTorchFile(dir_ + "/mixed.pt");
  const auto entries = tensorEntries(*v);
  expectMatches(entries, manifest_["mixed.pt"]);
  std::map<std::string, at::Tensor> byName(entries.begin(), entries.end());
  EXPECT_EQ(byName["half"].scalar_type(), at::kHalf);
  EXPECT_EQ(byName["bf16"].scalar_type(), at::kBFloat16);
  EXPECT_EQ(byName["long"].scalar_type(), at::kLong);
  EXPECT_EQ(byName["bool"].scalar_type(), at::kBool);
}

TEST_F(TorchFile, DamagedFilesAreNamedErrors) {
  auto messageFor = [](const std::string& path) {
    try {
      readTorchFile(path);
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  const std::string good = dir_ + "/dp_state_dict.pt";
  const auto size = fs::file_size(good);
  for (const double fraction : {0.3, 0.7, 0.95}) {
    const std::string cut = dir_ + "/cut.pt";
    fs::copy_file(good, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, static_cast<uintmax_t>(size * fraction));
    const std::string m = messageFor(cut);
    EXPECT_NE(m.find(cut), std::string::npos) << m;
    EXPECT_TRUE(m.find("truncated") != std::string::npos || m.find("corrupt") != std::string::npos) << m;
  }
  std::ofstream(dir_ + "/empty.pt").close();
  EXPECT_NE(messageFor(dir_ + "/empty.pt").find("is empty"), std::string::npos);
  std::ofstream(dir_ + "/text.pt") << "hello";
  EXPECT_NE(messageFor(dir_ + "/text.pt").find("not a PyTorch file"), std::string::npos);
  EXPECT_NE(messageFor(dir_ + "/legacy.pt").find("legacy (pre-1.6) format"), std::string::npos);
  EXPECT_NE(messageFor(dir_ + "/absent.pt").find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace ddp::checkpoint
