// The public helpers a trainer needs around the training step, through libddp.so as a user links
// it: atomic file writes, state dicts, the checkpoint list, the launch environment, the GPU reports.
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <ATen/ops/equal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

template <typename Error, typename F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

class Files : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ddp::test::makeTempDir("api-files"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(Files, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
  const std::string path = dir_ + "/summary.json";
  ddp::writeFileAtomic(path, "first");
  ddp::writeFileAtomic(path, std::string("second\0with a NUL", 17));
  EXPECT_EQ(contents(path), std::string("second\0with a NUL", 17));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) entries += e.path().filename() == "summary.json" ? 1 : 100;
  EXPECT_EQ(entries, 1) << "only the file itself, no .summary.json.tmp.<pid>";
  const std::string missing = errorOf<ddp::CheckpointError>([&] { ddp::writeFileAtomic(dir_ + "/no/such/f", "x"); });
  EXPECT_NE(missing.find(dir_ + "/no/such/"), std::string::npos) << missing;
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
  // Under a file (saveModel to "/etc/passwd/model.pt"): the file is named as such, not as missing.
  ddp::writeFileAtomic(dir_ + "/afile", "x");
  const std::string underFile = errorOf<ddp::CheckpointError>([&] { ddp::writeFileAtomic(dir_ + "/afile/m.pt", "x"); });
  EXPECT_NE(underFile.find("; '" + dir_ + "/afile' is a file, not a directory"), std::string::npos) << underFile;
}

// Issue 46 (2): a symbolic link planted under the temporary's (predictable) name is not written
// through: the victim keeps its bytes, the file gets the new ones.
TEST_F(Files, AtomicWriteNeverWritesThroughAPlantedLink) {
  const std::string victim = dir_ + "/victim";
  { std::ofstream(victim) << "precious"; }
  const std::string path = dir_ + "/model.pt";
  fs::create_symlink(victim, dir_ + "/.model.pt.tmp." + std::to_string(::getpid()));
  ddp::writeFileAtomic(path, "the model");
  EXPECT_EQ(contents(victim), "precious");
  EXPECT_EQ(contents(path), "the model");
  EXPECT_FALSE(fs::is_symlink(path));
}

TEST_F(Files, MakeDirectoriesNamesTheSettingToChange) {
  ddp::makeDirectories(dir_ + "/a/b/c", "--out");
  EXPECT_TRUE(fs::is_directory(dir_ + "/a/b/c"));
  ddp::makeDirectories(dir_ + "/a/b/c", "--out");  // exists: nothing to do
  ddp::writeFileAtomic(dir_ + "/file", "x");
  const std::string error = errorOf<ddp::ConfigError>([&] { ddp::makeDirectories(dir_ + "/file/sub", "--out"); });
  EXPECT_EQ(error.rfind("--out: cannot create directory '" + dir_ + "/file/sub': ", 0), 0u) << error;
  EXPECT_NE(error.find("; set --out to a writable path"), std::string::npos) << error;
  EXPECT_NE(error.find(": '" + dir_ + "/file' is a file, not a directory;"), std::string::npos) << error;
  const std::string itself = errorOf<ddp::ConfigError>([&] { ddp::makeDirectories(dir_ + "/file", "--out"); });
  EXPECT_NE(itself.find("cannot create directory '" + dir_ + "/file': '" + dir_ + "/file' is a file, not a directory"),
            std::string::npos)
      << itself;
}

TEST_F(Files, StateDictRoundTripsWithPlainKeys) {
  // A wrapper's "module." prefix goes, as saveModel's does.
  struct Wrapper : torch::nn::Module {
    Wrapper() { inner = register_module("module", torch::nn::Linear(3, 2)); }
    torch::nn::Linear inner{nullptr};
  } wrapper;
  const ddp::StateDict state = ddp::stateDict(wrapper);
  ASSERT_EQ(state.size(), 2u);
  EXPECT_TRUE(at::equal(state.at("weight"), wrapper.inner->weight));
  EXPECT_TRUE(at::equal(state.at("bias"), wrapper.inner->bias));
  ddp::saveStateDict(state, dir_ + "/model.pt");
  const ddp::StateDict back = ddp::loadTensors(dir_ + "/model.pt");
  ASSERT_EQ(back.size(), 2u);
  for (const auto& [key, tensor] : state) EXPECT_TRUE(at::equal(back.at(key), tensor)) << key;
  const std::string missing = errorOf<ddp::CheckpointError>([&] { ddp::loadTensors(dir_ + "/none.pt"); });
  EXPECT_NE(missing.find(dir_ + "/none.pt"), std::string::npos) << missing;
}

TEST_F(Files, CheckpointsAreListedByStepOldestFirst) {
  EXPECT_TRUE(ddp::listCheckpoints(dir_ + "/absent").empty());
  for (const char* name : {"ckpt-00000010.pt", "ckpt-00000002.pt", ".ckpt-00000012.pt.tmp.77", "model.pt"}) {
    ddp::writeFileAtomic(dir_ + "/" + name, "x");
  }
  EXPECT_EQ(ddp::listCheckpoints(dir_),
            (std::vector<std::string>{dir_ + "/ckpt-00000002.pt", dir_ + "/ckpt-00000010.pt"}));
}

// The environment of this process, set and restored around each case; what else launchEnv reads
// (a developer's shell, a CI job under Slurm) is unset meanwhile.
class Environment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                             "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE",
                             "DDP_RDZV_TOKEN", "DDP_RDZV_TOKEN_FILE", "DDP_STORE_FD", "OMPI_COMM_WORLD_RANK",
                             "SLURM_PROCID", "SLURM_NTASKS"}) {
      remember(name);
      ::unsetenv(name);
    }
  }
  void set(const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars) {
      remember(name);
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  void remember(const std::string& name) {
    if (saved_.count(name) != 0) return;
    if (const char* old = std::getenv(name.c_str())) saved_.emplace(name, std::string(old));
    else saved_.emplace(name, std::nullopt);
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(Environment, LaunchEnvIsWhatTheLauncherSaid) {
  set({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},
       {"TORCHELASTIC_RESTART_COUNT", "2"}});
  const ddp::LaunchEnv env = ddp::launchEnv();
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.worldSize, 4);
  EXPECT_EQ(env.localRank, 1);
  EXPECT_EQ(env.localWorldSize, 2);
  EXPECT_EQ(env.nodeRank, 1);
  EXPECT_EQ(env.restartCount, 2);
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(ddp::launchEnv(1).localRank, 1);
  const std::string disagree = errorOf<ddp::ConfigError>([] { ddp::launchEnv(0); });
  EXPECT_NE(disagree.find("--local_rank=0 disagrees with LOCAL_RANK=1"), std::string::npos) << disagree;
}

TEST_F(Environment, AContradictionIsOneLine) {
  set({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  const std::string error = errorOf<ddp::ConfigError>([] { ddp::launchEnv(); });
  EXPECT_NE(error.find("rank 4 (from torchrun) is not below the world size 4"), std::string::npos) << error;
  std::vector<std::string> args{"--local_rank=x", "config.yaml"};
  const std::string bad = errorOf<ddp::ConfigError>([&] { ddp::takeLegacyLocalRank(args); });
  EXPECT_NE(bad.find("--local_rank"), std::string::npos) << bad;
}

TEST(Gpus, ACpuDeviceHasNoGpuReport) {
  EXPECT_FALSE(ddp::gpuReport(c10::Device(c10::kCPU)).has_value());
  EXPECT_EQ(ddp::cudaMaxMemoryAllocated(c10::Device(c10::kCPU)), 0);
}

TEST(Gpus, NoVisibleGpuCountsZero) {
  // CUDA_VISIBLE_DEVICES="" hides every GPU from the driver; in a child of its own, whose first
  // count this is (the count is kept for the process), and whose environment goes with it.
  EXPECT_EXIT(
      {
        ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
        std::_Exit(ddp::cudaDeviceCount() == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
