// A plugin built with another LibTorch is refused at load with one line naming both (issue 27, 5).
// Its own binary: the plugin is loaded once per process.
#include "comm/cuda_plugin.h"

#include <gtest/gtest.h>
#include <torch/version.h>

#include <cstdlib>
#include <string>

#include "common/error.h"

namespace ddp::comm {
namespace {

TEST(CudaPlugin, APluginOfAnotherLibTorchIsOneLineNamingBothVersions) {
  if (!cudaPluginBuilt()) {
    GTEST_SKIP() << "this LibTorch has no CUDA (Debian's 1.13): no plugin is ever loaded";
  }
  ::setenv("DDP_CUDA_PLUGIN", DDP_FAKE_CUDA_PLUGIN, 1);
  try {
    loadCudaPlugin();
    FAIL() << "a plugin of LibTorch 0.0.1-other was accepted by a program on " << TORCH_VERSION;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::string(DDP_FAKE_CUDA_PLUGIN) + " was built for LibTorch 0.0.1-other and this program runs " +
                        TORCH_VERSION),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  // Refused for good: asking again gives the same answer, never the foreign plugin.
  EXPECT_THROW(loadCudaPlugin(), ConfigError);
}

}  // namespace
}  // namespace ddp::comm
