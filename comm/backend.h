// Which collective backend a job uses, and how "auto" is resolved.
#pragma once

#include <string>

namespace ddp::comm {

enum class Backend { kAuto, kGloo, kNccl };

/// Parses "auto" | "gloo" | "nccl"; throws ConfigError otherwise.
Backend parseBackend(const std::string& name);
std::string backendName(Backend backend);

/// True when this build can create ProcessGroupNCCL (a CUDA LibTorch).
bool ncclCompiled();

/// auto → nccl when the job runs on CUDA and NCCL is compiled in, else gloo.
/// An explicit nccl on a CPU device or without NCCL is a ConfigError.
Backend resolveBackend(Backend requested, bool deviceIsCuda);

}  // namespace ddp::comm
