// The device plan per rank (runs without a GPU: the visible-GPU count is an input),
// and the device control collectives use per backend.
#include <gtest/gtest.h>

#include "comm/process_group.h"
#include "common/error.h"
#include "libddp/runtime/device.h"

namespace ddp::runtime {
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
}  // namespace ddp::runtime
