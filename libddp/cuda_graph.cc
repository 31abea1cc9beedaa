#include "ddp/cuda_graph.h"

#include "comm/cuda_plugin.h"
#include "common/error.h"

namespace ddp {
namespace {

void runFunction(void* ctx) { (*static_cast<const std::function<void()>*>(ctx))(); }

}  // namespace

CudaGraph::CudaGraph(c10::Device device) {
  if (!device.is_cuda() || !device.has_index()) {
    DDP_THROW(ConfigError, "ddp::CudaGraph needs a CUDA device with an index (cuda:N), got ", device.str());
  }
  const comm::CudaPlugin& plugin = comm::loadCudaPlugin();
  if (plugin.graphCreate == nullptr) DDP_THROW(ConfigError, "ddp::CudaGraph: this build's CUDA plugin has no graphs");
  handle_ = plugin.graphCreate(device.index());
}

CudaGraph::~CudaGraph() {
  if (handle_ != nullptr) comm::loadCudaPlugin().graphDestroy(handle_);
}

void CudaGraph::warmUp(const std::function<void()>& step) {
  comm::loadCudaPlugin().graphRun(handle_, &runFunction, const_cast<std::function<void()>*>(&step), false);
}

void CudaGraph::capture(const std::function<void()>& step) {
  if (captured_) DDP_THROW(Error, "ddp::CudaGraph::capture: this graph was captured already; make another");
  comm::loadCudaPlugin().graphRun(handle_, &runFunction, const_cast<std::function<void()>*>(&step), true);
  captured_ = true;
}

void CudaGraph::replay() {
  if (!captured_) DDP_THROW(Error, "ddp::CudaGraph::replay before capture()");
  comm::loadCudaPlugin().graphReplay(handle_);
}

bool CudaGraph::finished() const { return comm::loadCudaPlugin().graphIdle(handle_); }

}  // namespace ddp
