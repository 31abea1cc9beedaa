// ddp::stateDict / saveStateDict against the reference: Python PyTorch's plain torch.load
// (weights_only by default) loads the file into the Python twin of our model with
// load_state_dict(strict=True) to the values we wrote; ddp::loadTensors reads the
// state_dicts Python's torch.save writes (plain, DataParallel, DDP).
#include <gtest/gtest.h>

#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "ddp/error.h"
#include "ddp/state_dict.h"
#include "worker/models/models.h"
#include "tests/support/run_command.h"

namespace ddp::worker {
namespace {

namespace fs = std::filesystem;

const char* pythonDtype(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kLong: return "int64";
    default: return "other";
  }
}

// Every entry of `state` equals, exactly, what Python's model holds after the strict load.
void expectPythonHolds(const nlohmann::json& py, const std::map<std::string, at::Tensor>& state) {
  ASSERT_EQ(py["type"], "OrderedDict") << "torch.save(model.state_dict()) writes an OrderedDict";
  const auto& got = py["state"];
  ASSERT_EQ(got.size(), state.size());
  for (const auto& [name, t] : state) {
    ASSERT_TRUE(got.contains(name)) << name;
    const auto& e = got[name];
    EXPECT_EQ(e["dtype"], pythonDtype(t.scalar_type())) << name;
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), t.sizes().vec()) << name;
    const auto values = e["values"].get<std::vector<double>>();
    const at::Tensor flat = t.to(at::kDouble).flatten().contiguous();
    ASSERT_EQ(static_cast<int64_t>(values.size()), flat.numel()) << name;
    const double* ours = flat.data_ptr<double>();
    size_t differing = 0;
    for (size_t i = 0; i < values.size(); ++i) differing += values[i] != ours[i];
    EXPECT_EQ(differing, 0u) << name << ": values differ from those written";
  }
}

nlohmann::json checkInPython(const std::string& path, const std::string& model, const std::string& hidden) {
  const std::string out = ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/check_export.py", path,
                                                 model, hidden, "--values"},
                                                ddp::test::CommandOptions())
                              .output;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    ADD_FAILURE() << "Python could not load " << path << ":\n" << out.substr(0, 4000);
    return {};
  }
}

TEST(ModelExport, MlpLoadsStrictlyInPythonToTheValuesWritten) {
  const std::string dir = ddp::test::makeTempDir("export");
  Mlp mlp(InputSpec{1, 28, 28, 10}, std::vector<int64_t>{16, 8});
  const auto state = stateDict(*mlp);
  saveStateDict(state, dir + "/model.pt");
  const nlohmann::json py = checkInPython(dir + "/model.pt", "mlp", "16,8");
  if (!py.is_null()) expectPythonHolds(py, state);
  fs::remove_all(dir);
}

TEST(ModelExport, BatchNormCnnLoadsStrictlyInPythonWithItsBuffers) {
  const std::string dir = ddp::test::makeTempDir("export");
  Cnn cnn(InputSpec{1, 28, 28, 10}, /*batchNorm=*/true);
  cnn->train();
  cnn->forward(at::randn({4, 1, 28, 28}));  // running stats off their start, num_batches_tracked = 1
  const auto state = stateDict(*cnn);
  ASSERT_EQ(state.at("bn1.num_batches_tracked").item<int64_t>(), 1);
  saveStateDict(state, dir + "/model.pt");
  const nlohmann::json py = checkInPython(dir + "/model.pt", "cnn", "0");
  if (!py.is_null()) expectPythonHolds(py, state);
  fs::remove_all(dir);
}

TEST(ModelExport, ReadStateDictReadsOurExportAndPythonsStateDicts) {
  const std::string dir = ddp::test::makeTempDir("export");
  Mlp mlp(InputSpec{1, 28, 28, 10}, std::vector<int64_t>{16});
  const auto state = stateDict(*mlp);
  saveStateDict(state, dir + "/model.pt");
  const auto back = loadTensors(dir + "/model.pt");
  ASSERT_EQ(back.size(), state.size());
  for (const auto& [name, t] : state) EXPECT_TRUE(at::equal(back.at(name), t)) << name;

  const auto manifest = nlohmann::json::parse(
      ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/make_torch_files.py", dir},
                            ddp::test::stdoutOnly())
          .output);
  for (const std::string file : {"plain_state_dict.pt", "dp_state_dict.pt", "ddp_state_dict.pt"}) {
    const auto read = loadTensors(dir + "/" + file);
    const auto& expected = manifest.at(file);
    ASSERT_EQ(read.size(), expected.size()) << file;
    for (const auto& [name, e] : expected.items()) {
      ASSERT_EQ(read.count(name), 1u) << file << ": " << name;
      const at::Tensor flat = read.at(name).to(at::kDouble).flatten().contiguous();
      EXPECT_EQ(read.at(name).sizes().vec(), e["shape"].get<std::vector<int64_t>>()) << file << ": " << name;
      const auto values = e["values"].get<std::vector<double>>();
      ASSERT_EQ(flat.numel(), static_cast<int64_t>(values.size())) << name;
      for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(flat[i].item<double>(), values[i]) << file << ": " << name;
    }
  }
  // The top-level dict's tensors only: checkpoint.pt holds {"model": {...}, "epoch": 3, "lr": ..., "steps": [...]}.
  EXPECT_TRUE(loadTensors(dir + "/checkpoint.pt").empty());
  const auto mixed = loadTensors(dir + "/mixed.pt");
  EXPECT_EQ(mixed.size(), manifest.at("mixed.pt").size());
  for (const auto& [name, e] : manifest.at("mixed.pt").items()) EXPECT_EQ(mixed.count(name), 1u) << name;
  try {
    loadTensors(dir + "/legacy.pt");
    ADD_FAILURE() << "a legacy-format file loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("legacy (pre-1.6) format"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddp::worker
