// Which collective backend a job uses, and how "auto" is resolved.
#pragma once

#include <string>

#include "ddp/collectives.h"

namespace ddp::comm {

using Backend = ::ddp::Backend;

/// Parses "auto" | "gloo" | "nccl" | "shm"; throws ConfigError otherwise.
Backend parseBackend(const std::string& name);

/// True when this build can create ProcessGroupNCCL (a CUDA LibTorch).
bool ncclCompiled();

/// auto → nccl when the job runs on CUDA and NCCL is compiled in; shm for a
/// CPU job whose ranks all run on this host; else gloo. An explicit nccl on a
/// CPU device or without NCCL, or shm on CUDA or across hosts, is a ConfigError.
Backend resolveBackend(Backend requested, bool deviceIsCuda, bool singleHost = false);

}  // namespace ddp::comm
