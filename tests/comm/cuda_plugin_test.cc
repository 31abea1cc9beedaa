// LibTorch's CUDA half is not in a CPU process until the plugin brings it (comm/cuda_plugin.h).
#include "comm/cuda_plugin.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "comm/backend.h"

namespace ddp::comm {
namespace {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/" + library) != std::string::npos) return true;
  }
  return false;
}

TEST(CudaPlugin, LoadsLibTorchCudaOnlyWhenAsked) {
  if (!cudaPluginBuilt()) {
    GTEST_SKIP() << "this LibTorch has no CUDA (Debian's 1.13): there is no plugin to load";
  }
  // Linked like the worker: the CPU half only.
  EXPECT_FALSE(mapped("libtorch_cuda.so"));
  EXPECT_FALSE(mapped("libcublasLt.so"));
  EXPECT_FALSE(c10::impl::hasDeviceGuardImpl(c10::kCUDA));

  const CudaPlugin& plugin = loadCudaPlugin();
  EXPECT_EQ(plugin.abi, kCudaPluginAbi);
  EXPECT_NE(plugin.peakAllocatedBytes, nullptr);
  EXPECT_EQ(plugin.makeNccl != nullptr, ncclCompiled());
  // LibTorch's CUDA registered itself as if linked: the CUDA device guard exists now.
  EXPECT_TRUE(mapped("libtorch_cuda.so"));
  EXPECT_TRUE(c10::impl::hasDeviceGuardImpl(c10::kCUDA));
  EXPECT_EQ(&loadCudaPlugin(), &plugin) << "loaded once";
}

TEST(CudaPlugin, DriverCountIsZeroWithoutADriverAndNeverLoadsTorchCuda) {
  const int n = driverGpuCount();
  EXPECT_GE(n, 0);
  std::ifstream driver("/proc/driver/nvidia/version");
  if (!driver) EXPECT_EQ(n, 0) << "no NVIDIA driver here, yet the driver API counted GPUs";
}

}  // namespace
}  // namespace ddp::comm
