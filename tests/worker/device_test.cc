// The device plan per rank (runs without a GPU: the visible-GPU count is an input),
// and the device control collectives use per backend.
#include <gtest/gtest.h>

#include "comm/process_group.h"
#include "libddp/internal.h"
#include "common/error.h"
#include "worker/config/config.h"
#include "libddp/runtime/device.h"
#include "worker/report/rank_report.h"

#include <ATen/Context.h>

#include <cstdlib>

namespace ddp::worker {
using namespace ddp::runtime;
namespace {

DeviceRequest request(std::string device, int localRank, int localWorldSize, int gpus, bool share = false) {
  DeviceRequest r;
  r.requested = std::move(device);
  r.localRank = localRank;
  r.localWorldSize = localWorldSize;
  r.visibleGpus = gpus;
  r.ranksMayShareGpu = share;
  return r;
}

std::string errorOf(const DeviceRequest& r) {
  try {
    planDevice(r);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(DevicePlan, CpuAndAutoWithoutGpus) {
  EXPECT_EQ(planDevice(request("cpu", 3, 4, 8)), c10::Device(c10::kCPU));
  EXPECT_EQ(planDevice(request("auto", 1, 2, 0)), c10::Device(c10::kCPU));
  EXPECT_NE(errorOf(request("cuda", 0, 1, 0)).find("no GPU is visible"), std::string::npos);
  EXPECT_NE(errorOf(request("cuda:0", 0, 1, 0)).find("no GPU is visible"), std::string::npos);
}

TEST(DevicePlan, EachRankTakesItsLocalRank) {
  for (int localRank = 0; localRank < 4; ++localRank) {
    EXPECT_EQ(planDevice(request("auto", localRank, 4, 4)), c10::Device(c10::kCUDA, localRank));
    EXPECT_EQ(planDevice(request("cuda", localRank, 4, 4)), c10::Device(c10::kCUDA, localRank));
  }
}

TEST(DevicePlan, MoreRanksThanVisibleGpusIsRefused) {
  const std::string error = errorOf(request("auto", 2, 3, 2));
  EXPECT_NE(error.find("LOCAL_RANK 2 needs GPU 2 but only 2 GPU(s) are visible"), std::string::npos) << error;
  EXPECT_NE(errorOf(request("cuda:5", 0, 1, 2)).find("device cuda:5 needs GPU 5"), std::string::npos);
}

TEST(DevicePlan, OneFixedGpuForSeveralRanksIsRefusedUnderNccl) {
  const std::string error = errorOf(request("cuda:1", 0, 2, 4));
  EXPECT_NE(error.find("puts all 2 ranks of this host on one GPU"), std::string::npos) << error;
  EXPECT_NE(error.find("Duplicate GPU"), std::string::npos) << error;
  // Gloo lets ranks share a GPU; a single rank may name any visible GPU.
  EXPECT_EQ(planDevice(request("cuda:1", 1, 2, 4, /*share=*/true)), c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(planDevice(request("cuda:3", 0, 1, 4)), c10::Device(c10::kCUDA, 3));
}

TEST(CollectiveDevice, NcclUsesTheRanksGpuOthersTheCpu) {
  const c10::Device gpu(c10::kCUDA, 3);
  EXPECT_EQ(comm::collectiveDevice(comm::Backend::kNccl, gpu), gpu);
  EXPECT_EQ(comm::collectiveDevice(comm::Backend::kGloo, gpu), c10::Device(c10::kCPU));
  EXPECT_EQ(comm::collectiveDevice(comm::Backend::kShm, c10::Device(c10::kCPU)), c10::Device(c10::kCPU));
}

}  // namespace
}  // namespace ddp::worker

namespace ddp::worker {
using namespace ddp::runtime;
namespace {

// cudnn.* and deterministic_algorithms reach LibTorch's global context, as torch.backends does.
TEST(Numerics, ConfigKeysSetLibTorchsGlobalFlags) {
  const WorkerConfig config = loadConfig("/dev/null", {"cudnn.benchmark=true", "cudnn.deterministic=true",
                                                       "deterministic_algorithms=true"});
  EXPECT_TRUE(config.cudnn.benchmark);
  EXPECT_TRUE(config.cudnn.deterministic);
  EXPECT_TRUE(config.deterministicAlgorithms);
  const WorkerConfig defaults = loadConfig("/dev/null");
  EXPECT_FALSE(defaults.cudnn.benchmark);  // PyTorch's defaults
  EXPECT_FALSE(defaults.cudnn.deterministic);
  EXPECT_FALSE(defaults.deterministicAlgorithms);

  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  applyNumerics(true, true, true);
  EXPECT_TRUE(at::globalContext().benchmarkCuDNN());
  EXPECT_TRUE(at::globalContext().deterministicCuDNN());
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  applyNumerics(false, false, true);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":16:8") << "the user's setting wins";
  applyNumerics(false, false, false);
  EXPECT_FALSE(at::globalContext().benchmarkCuDNN());
  EXPECT_FALSE(at::globalContext().deterministicCuDNN());
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
}

// Every rank's report survives the trip to rank 0: numbers and the GPU's strings.
TEST(RankReports, StringsAndNumbersReachRankZero) {
  comm::LocalCommunicator one;
  ProcessGroup local = api::wrapCommunicator(one, c10::Device(c10::kCPU));
  RankReport mine;
  mine.peakRssMb = 233.8;
  mine.ownDataCopy = false;
  mine.device = "cuda:3";
  mine.gpu = GpuUse{"NVIDIA H100 80GB HBM3", "00000000:18:00.0", 81559, 1234.5, 2048};
  const auto reports = gatherRankReports(local, mine);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_DOUBLE_EQ(reports[0].peakRssMb, 233.8);
  EXPECT_FALSE(reports[0].ownDataCopy);
  EXPECT_EQ(reports[0].device, "cuda:3");
  ASSERT_TRUE(reports[0].gpu.has_value());
  EXPECT_EQ(reports[0].gpu->name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(reports[0].gpu->pciBusId, "00000000:18:00.0");
  EXPECT_DOUBLE_EQ(reports[0].gpu->peakReservedMb, 2048);
  const nlohmann::json gpus = gpuSummary(reports);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0]["rank"], 0);
  EXPECT_EQ(gpus[0]["pci_bus_id"], "00000000:18:00.0");
  EXPECT_DOUBLE_EQ(gpus[0]["peak_allocated_mb"].get<double>(), 1234.5);
  EXPECT_EQ(gpuReportLines(reports).front(),
            "GPU report: rank 0 cuda:3 NVIDIA H100 80GB HBM3 (00000000:18:00.0, 81559 MiB): peak allocated 1234.5 MiB, "
            "reserved 2048.0 MiB");

  const RankReport cpu = measureRank(c10::Device(c10::kCPU), true);
  EXPECT_FALSE(cpu.gpu.has_value());
  EXPECT_GT(cpu.peakRssMb, 1.0);
  EXPECT_TRUE(gpuSummary(gatherRankReports(local, cpu)).empty());
}

}  // namespace
}  // namespace ddp::worker
