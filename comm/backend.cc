#include "comm/backend.h"

#include "common/error.h"

namespace ddp::comm {

Backend parseBackend(const std::string& name) {
  if (const auto backend = ::ddp::parseBackend(name)) return *backend;
  DDP_THROW(ConfigError, "config: backend '", name, "' is not one of auto | gloo | nccl | shm");
}

bool ncclCompiled() {
#ifdef DDP_WITH_NCCL
  return true;
#else
  return false;
#endif
}

Backend resolveBackend(Backend requested, bool deviceIsCuda, bool singleHost) {
  switch (requested) {
    case Backend::kAuto:
      if (deviceIsCuda) return ncclCompiled() ? Backend::kNccl : Backend::kGloo;
      return singleHost ? Backend::kShm : Backend::kGloo;
    case Backend::kShm:
      if (deviceIsCuda) DDP_THROW(ConfigError, "config: backend 'shm' is for CPU ranks; use nccl (or auto) on GPUs");
      if (!singleHost) DDP_THROW(ConfigError, "config: backend 'shm' needs every rank on this host; use gloo (or auto) across nodes");
      return Backend::kShm;
    case Backend::kGloo:
      return Backend::kGloo;
    case Backend::kNccl:
      if (!ncclCompiled()) {
        DDP_THROW(ConfigError,
                  "config: backend 'nccl' needs a CUDA build of LibTorch, but this worker was "
                  "built against a CPU LibTorch; use backend: gloo (or auto)");
      }
      if (!deviceIsCuda) {
        DDP_THROW(ConfigError,
                  "config: backend 'nccl' needs a GPU per rank, but this rank runs on CPU; "
                  "use backend: gloo (or auto)");
      }
      return Backend::kNccl;
    case Backend::kLocal:
      DDP_THROW(ConfigError, "backend 'local' is what a group of one reports; ask for auto, gloo, nccl or shm");
  }
  return Backend::kGloo;
}

}  // namespace ddp::comm
