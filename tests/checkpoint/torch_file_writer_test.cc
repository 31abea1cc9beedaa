// The torch.save-format writer: Python PyTorch's plain torch.load (weights_only
// by default) reads what we write to the values we wrote, and our own reader
// round-trips it. Expected values come from the formulas that made the tensors.
#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <limits>

#include "libddp/checkpoint/torch_file.h"
#include "libddp/checkpoint/torch_file_writer.h"
#include "common/error.h"
#include "tests/support/run_command.h"

namespace ddp::checkpoint {
namespace {

namespace fs = std::filesystem;

struct DtypeCase {
  c10::ScalarType dtype;
  const char* pythonName;
};
const DtypeCase kDtypes[] = {{c10::kFloat, "float32"}, {c10::kDouble, "float64"}, {c10::kHalf, "float16"},
                             {c10::kBFloat16, "bfloat16"}, {c10::kLong, "int64"}, {c10::kInt, "int32"},
                             {c10::kShort, "int16"}, {c10::kChar, "int8"}, {c10::kByte, "uint8"},
                             {c10::kBool, "bool"}};

// 0, 1, ..., 11 as a 3x4 tensor of `dtype` (bool: i % 2), exactly representable in every dtype.
at::Tensor sample(c10::ScalarType dtype) {
  at::Tensor t = at::arange(12, at::kDouble).reshape({3, 4});
  if (dtype == c10::kBool) t = t.fmod(2);
  return t.to(dtype);
}

nlohmann::json readInPython(const std::string& path) {
  const std::string out =
      ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/read_torch_file.py", path},
                            ddp::test::CommandOptions())
          .output;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    ADD_FAILURE() << "Python could not read " << path << ":\n" << out;
    return {};
  }
}

// {"__dict__": [[k, v], ...]} → the value of `key`.
const nlohmann::json& entry(const nlohmann::json& dict, const std::string& key) {
  for (const auto& kv : dict.at("__dict__")) {
    if (kv[0] == key) return kv[1];
  }
  static const nlohmann::json missing;
  ADD_FAILURE() << "no key " << key;
  return missing;
}

TEST(TorchFileWriter, PythonTorchLoadReadsEveryDtypeToTheValuesWritten) {
  const std::string dir = ddp::test::makeTempDir("writer");
  auto root = pyDict();
  for (const auto& c : kDtypes) {
    pySet(*root, c.pythonName, pyTensor(sample(c.dtype)));
    pySet(*root, std::string(c.pythonName) + " 0-dim", pyTensor(sample(c.dtype)[1][3]));  // element 7
  }
  // A transposed view (non-contiguous), a view at a storage offset, a 0-dim tensor and an empty one.
  pySet(*root, "transposed", pyTensor(sample(c10::kFloat).t()));
  pySet(*root, "offset view", pyTensor(at::arange(12, at::kFloat).slice(0, 2, 8).view({2, 3})));
  pySet(*root, "scalar", pyTensor(at::scalar_tensor(2.5)));
  pySet(*root, "empty", pyTensor(at::arange(0, at::kFloat)));
  writeTorchFile(*root, dir + "/all.pt");

  const nlohmann::json py = readInPython(dir + "/all.pt");
  ASSERT_TRUE(py.is_object());
  for (const auto& c : kDtypes) {
    const auto& t = entry(py, c.pythonName);
    EXPECT_EQ(t["dtype"], c.pythonName);
    EXPECT_EQ(t["shape"], nlohmann::json({3, 4})) << c.pythonName;
    EXPECT_EQ(t["device"], "cpu");
    EXPECT_EQ(t["requires_grad"], false);
    for (int i = 0; i < 12; ++i) {
      EXPECT_EQ(t["values"][i].get<double>(), c.dtype == c10::kBool ? i % 2 : i) << c.pythonName << "[" << i << "]";
    }
    const auto& scalar = entry(py, std::string(c.pythonName) + " 0-dim");
    EXPECT_EQ(scalar["dtype"], c.pythonName);
    EXPECT_EQ(scalar["shape"], nlohmann::json::array()) << c.pythonName;
    EXPECT_EQ(scalar["values"][0].get<double>(), c.dtype == c10::kBool ? 1 : 7) << c.pythonName;
  }
  EXPECT_EQ(entry(py, "offset view")["values"], nlohmann::json({2.0, 3.0, 4.0, 5.0, 6.0, 7.0}));
  const auto& tr = entry(py, "transposed");
  EXPECT_EQ(tr["shape"], nlohmann::json({4, 3}));
  for (int r = 0; r < 4; ++r) {
    for (int k = 0; k < 3; ++k) EXPECT_EQ(tr["values"][r * 3 + k].get<double>(), k * 4 + r);
  }
  EXPECT_EQ(entry(py, "scalar")["shape"], nlohmann::json::array());
  EXPECT_EQ(entry(py, "scalar")["values"][0].get<double>(), 2.5);
  EXPECT_EQ(entry(py, "empty")["shape"], nlohmann::json({0}));
  fs::remove_all(dir);
}

TEST(TorchFileWriter, PythonReadsScalarsStringsAndNestedContainers) {
  const std::string dir = ddp::test::makeTempDir("writer");
  auto root = pyDict();
  const int64_t big = std::numeric_limits<int64_t>::max();
  for (int64_t v : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{-1}, int64_t{2147483647}, int64_t{-2147483648LL},
                    int64_t{4294967296LL}, big, std::numeric_limits<int64_t>::min()}) {
    pySet(*root, "int " + std::to_string(v), pyInt(v));
  }
  pySet(*root, "float", pyFloat(-0.1));
  pySet(*root, "true", pyBool(true));
  pySet(*root, "none", pyNone());
  pySet(*root, "text", pyString("résumé: 学习"));
  auto inner = pyDict();
  pySet(*inner, "w", pyTensor(at::arange(3, at::kLong)));
  auto list = pyList();
  list->items = {pyInt(1), pyString("two"), inner};
  pySet(*root, "list", list);
  writeTorchFile(*root, dir + "/mixed.pt");

  const nlohmann::json py = readInPython(dir + "/mixed.pt");
  ASSERT_TRUE(py.is_object());
  for (int64_t v : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{-1}, int64_t{2147483647}, int64_t{-2147483648LL},
                    int64_t{4294967296LL}, big, std::numeric_limits<int64_t>::min()}) {
    EXPECT_EQ(entry(py, "int " + std::to_string(v)).get<int64_t>(), v);
  }
  EXPECT_EQ(entry(py, "float").get<double>(), -0.1);
  EXPECT_EQ(entry(py, "true"), true);
  EXPECT_TRUE(entry(py, "none").is_null());
  EXPECT_EQ(entry(py, "text"), "résumé: 学习");
  const auto& l = entry(py, "list");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0], 1);
  EXPECT_EQ(l[1], "two");
  EXPECT_EQ(entry(l[2], "w")["values"], nlohmann::json({0.0, 1.0, 2.0}));
  fs::remove_all(dir);
}

TEST(TorchFileWriter, OurReaderRoundTripsWhatWeWrite) {
  const std::string dir = ddp::test::makeTempDir("writer");
  auto root = pyOrderedDict();
  for (const auto& c : kDtypes) {
    const std::string name = c.pythonName;
    pySet(*root, name, pyTensor(sample(c.dtype)));
    pySet(*root, name + " transposed", pyTensor(sample(c.dtype).t()));  // non-contiguous
    pySet(*root, name + " 0-dim", pyTensor(sample(c.dtype)[2][3]));       // a 0-dim view at an offset
    pySet(*root, name + " empty", pyTensor(sample(c.dtype).slice(0, 0, 0)));
  }
  const at::Tensor base = at::arange(12, at::kFloat);
  pySet(*root, "offset view", pyTensor(base.slice(0, 2, 8).view({2, 3})));  // contiguous, storage offset 2
  pySet(*root, "expanded", pyTensor(base.slice(0, 0, 3).unsqueeze(0).expand({2, 3})));  // stride 0
  auto inner = pyDict();
  pySet(*inner, "step", pyInt(-7));
  auto pair = pyTuple();
  pair->items = {pyFloat(0.5), pyNone()};
  pySet(*inner, "pair", pair);
  pySet(*root, "inner", inner);
  writeTorchFile(*root, dir + "/round.pt");

  const PyValuePtr back = readTorchFile(dir + "/round.pt");
  EXPECT_TRUE(back->ordered);
  for (const auto& c : kDtypes) {
    const std::string name = c.pythonName;
    for (const auto& [key, expected] : {std::pair{name, sample(c.dtype)}, std::pair{name + " transposed", sample(c.dtype).t()},
                                        std::pair{name + " 0-dim", sample(c.dtype)[2][3]},
                                        std::pair{name + " empty", sample(c.dtype).slice(0, 0, 0)}}) {
      const PyValue* t = back->get(key);
      ASSERT_NE(t, nullptr) << key;
      ASSERT_EQ(t->kind, PyValue::Kind::kTensor) << key;
      EXPECT_EQ(t->tensor.scalar_type(), c.dtype) << key;
      EXPECT_EQ(t->tensor.sizes(), expected.sizes()) << key;
      EXPECT_TRUE(at::equal(t->tensor, expected)) << key;
    }
    EXPECT_EQ(back->get(name + " 0-dim")->tensor.dim(), 0) << name;
  }
  // Formulas: base[2:8] = 2..7; each row of the expanded tensor is 0, 1, 2.
  EXPECT_TRUE(at::equal(back->get("offset view")->tensor, at::arange(2, 8, at::kFloat).view({2, 3})));
  EXPECT_TRUE(at::equal(back->get("expanded")->tensor, at::arange(3, at::kFloat).repeat({2, 1})));
  const PyValue* in = back->get("inner");
  ASSERT_NE(in, nullptr);
  EXPECT_FALSE(in->ordered);
  EXPECT_EQ(in->get("step")->integer, -7);
  ASSERT_EQ(in->get("pair")->kind, PyValue::Kind::kTuple);
  EXPECT_EQ(in->get("pair")->items.at(0)->real, 0.5);
  EXPECT_EQ(in->get("pair")->items.at(1)->kind, PyValue::Kind::kNone);
  fs::remove_all(dir);
}

TEST(TorchFileWriter, RefusesWhatTorchSaveWouldNotWrite) {
  auto complex = pyDict();
  pySet(*complex, "c", pyTensor(at::arange(3, at::kFloat).to(c10::kComplexFloat)));
  EXPECT_THROW(torchFileBytes(*complex), ddp::CheckpointError);
  auto sparse = pyDict();
  pySet(*sparse, "s", pyTensor(at::arange(3, at::kFloat).to_sparse()));
  EXPECT_THROW(torchFileBytes(*sparse), ddp::CheckpointError);
  auto other = pyDict();
  auto opaque = std::make_shared<PyValue>();
  opaque->kind = PyValue::Kind::kOther;
  opaque->text = "builtins.set";
  pySet(*other, "o", opaque);
  EXPECT_THROW(torchFileBytes(*other), ddp::CheckpointError);
}

TEST(TorchFileWriter, AFailedWriteLeavesTheOldFile) {
  const std::string dir = ddp::test::makeTempDir("writer");
  auto good = pyDict();
  pySet(*good, "w", pyTensor(at::arange(4, at::kFloat)));
  writeTorchFile(*good, dir + "/model.pt");
  auto bad = pyDict();
  pySet(*bad, "w", pyTensor(at::arange(4, at::kFloat)));
  pySet(*bad, "c", pyTensor(at::arange(3, at::kFloat).to(c10::kComplexFloat)));  // refused mid-pickle
  EXPECT_THROW(writeTorchFile(*bad, dir + "/model.pt"), ddp::CheckpointError);
  EXPECT_THROW(writeTorchFile(*good, dir + "/no-such-dir/model.pt"), ddp::CheckpointError);
  EXPECT_TRUE(at::equal(readTorchFile(dir + "/model.pt")->get("w")->tensor, at::arange(4, at::kFloat)));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1) << "no temporary left";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddp::checkpoint
