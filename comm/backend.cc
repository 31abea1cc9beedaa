#include "comm/backend.h"

#include "common/error.h"

namespace ddp::comm {

Backend parseBackend(const std::string& name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  DDP_THROW(ConfigError, "config: backend '", name, "' is not one of auto | gloo | nccl");
}

std::string backendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
  }
  return "?";
}

bool ncclCompiled() {
#ifdef DDP_WITH_NCCL
  return true;
#else
  return false;
#endif
}

Backend resolveBackend(Backend requested, bool deviceIsCuda) {
  switch (requested) {
    case Backend::kAuto:
      return deviceIsCuda && ncclCompiled() ? Backend::kNccl : Backend::kGloo;
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
  }
  return Backend::kGloo;
}

}  // namespace ddp::comm
