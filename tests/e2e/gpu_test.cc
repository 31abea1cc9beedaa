// GPU paths, end to end: one rank on cuda:0 over a real NCCL group (train,
// export, eval), two ranks sharing cuda:0 over Gloo with CUDA tensors through
// the Reducer, and mode dp on cuda:0. Skipped (and reported as skipped) where
// no GPU is visible, as in CI; run on a machine with a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "tests/e2e/run_command.h"

namespace ddp {
namespace {

std::string dataRoot() {
  const char* root = std::getenv("DDP_FASHION_MNIST_ROOT");
  return root ? root : "/usr/share/datasets/fashion-mnist";
}

std::string config() { return std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml"; }

nlohmann::json summaryOf(const std::string& dir) {
  return nlohmann::json::parse(test::readFile(dir + "/summary.json"));
}

std::string shell(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
  ::pclose(pipe);
  return out;
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU visible to this process";
  }
};

TEST_F(Gpu, OneRankOnNcclTrainsExportsAndEvaluates) {
  const std::string dir = test::makeTempDir("gpu_nccl");
  const auto run = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN, config(),
                                     "backend=nccl", "device=cuda", "data.root=" + dataRoot(),
                                     "train.max_steps=200", "output.dir=" + dir},
                                    600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto summary = summaryOf(dir);
  std::cout << "nccl, 1 rank: " << summary.dump() << std::endl;  // figures for the GPU report
  EXPECT_EQ(summary["backend"], "nccl");
  EXPECT_EQ(summary["device"], "cuda:0");
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.7);
  EXPECT_GT(summary["cuda_peak_allocated_mb_per_device"][0].get<double>(), 0.0);

  // The export loads in Python PyTorch (plain torch.load, strict keys) to the same accuracy.
  const std::string out = shell(std::string(DDP_PYTHON) + " " + DDP_SOURCE_DIR + "/tests/python/check_export.py " +
                                dir + "/model.pt cnn 0 " + dataRoot() + " 2>&1");
  nlohmann::json py;
  ASSERT_NO_THROW(py = nlohmann::json::parse(out)) << out;
  EXPECT_NEAR(py["accuracy"].get<double>(), summary["test_accuracy"].get<double>(), 0.002);

  // mode eval on the GPU reads the export back to the same accuracy.
  const std::string evalDir = dir + "/eval";
  const auto eval = test::runCommand({DDP_WORKER_BIN, config(), "mode=eval", "device=cuda",
                                      "eval.model_path=" + dir + "/model.pt", "data.root=" + dataRoot(),
                                      "output.dir=" + evalDir},
                                     300);
  ASSERT_EQ(eval.exitCode, 0) << eval.output;
  EXPECT_NEAR(summaryOf(evalDir)["test_accuracy"].get<double>(), summary["test_accuracy"].get<double>(), 0.002);
}

TEST_F(Gpu, TwoRanksShareOneGpuOverGlooLikeOnCpu) {
  const std::string gpuDir = test::makeTempDir("gpu_gloo");
  const std::string cpuDir = test::makeTempDir("cpu_gloo");
  const std::vector<std::string> common{DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, config(),
                                        "backend=gloo", "data.root=" + dataRoot(), "train.max_steps=150"};
  auto gpuArgs = common;
  gpuArgs.insert(gpuArgs.end(), {"device=cuda:0", "output.dir=" + gpuDir});
  auto cpuArgs = common;
  cpuArgs.insert(cpuArgs.end(), {"device=cpu", "output.dir=" + cpuDir});
  const auto gpu = test::runCommand(gpuArgs, 600);
  ASSERT_EQ(gpu.exitCode, 0) << gpu.output;
  const auto cpu = test::runCommand(cpuArgs, 600);
  ASSERT_EQ(cpu.exitCode, 0) << cpu.output;
  const auto g = summaryOf(gpuDir);
  const auto c = summaryOf(cpuDir);
  std::cout << "gloo, 2 ranks on cuda:0: " << g.dump() << "\ngloo, 2 ranks on cpu: " << c.dump() << std::endl;
  EXPECT_EQ(g["device"], "cuda:0");
  EXPECT_EQ(g["backend"], "gloo");
  // Same seed, data and reducer; only the kernels differ (cuDNN vs CPU): results agree closely.
  EXPECT_NEAR(g["test_accuracy"].get<double>(), c["test_accuracy"].get<double>(), 0.02);
  EXPECT_NEAR(g["final_loss"].get<double>(), c["final_loss"].get<double>(), 0.1);
}

TEST_F(Gpu, DataParallelOnCuda) {
  const std::string dir = test::makeTempDir("gpu_dp");
  const auto run = test::runCommand({DDP_WORKER_BIN, config(), "mode=dp", "device=cuda", "dp.device_ids=[0]",
                                     "data.root=" + dataRoot(), "train.max_steps=200", "output.dir=" + dir},
                                    600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto summary = summaryOf(dir);
  std::cout << "dp on cuda:0: " << summary.dump() << std::endl;
  EXPECT_EQ(summary["mode"], "dp");
  EXPECT_EQ(summary["dp_devices"][0], "cuda:0");
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.7);
}

}  // namespace
}  // namespace ddp
