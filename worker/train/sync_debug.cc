#include "worker/train/sync_debug.h"

#include "ddp/cuda.h"

namespace ddp::worker {

SyncDebug::SyncDebug(const std::string& mode) : level_(mode == "error" ? 2 : mode == "warn" ? 1 : 0) {}

void SyncDebug::pause() {
  if (!on_) return;
  setCudaSyncDebugMode(CudaSyncDebugMode::kDefault);
  on_ = false;
}

void SyncDebug::resume() {
  if (level_ == 0 || on_) return;
  setCudaSyncDebugMode(static_cast<CudaSyncDebugMode>(level_));
  on_ = true;
}

}  // namespace ddp::worker
