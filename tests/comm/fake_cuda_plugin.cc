// A libddp_cuda.so as another LibTorch's build would make it: the right ABI, another version.
#include "comm/cuda_plugin.h"

extern "C" __attribute__((visibility("default"))) const ddp::comm::CudaPlugin* ddp_cuda_plugin() {
  static const ddp::comm::CudaPlugin plugin{ddp::comm::kCudaPluginAbi, nullptr, nullptr, nullptr, "0.0.1-other", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  return &plugin;
}
