// The name of the shm backend's segment, shared by the worker (creates it) and the
// launcher (removes what a killed worker left behind).
#pragma once

#include <string>

#include <sys/types.h>

namespace ddp {

/// File name in /dev/shm of every segment the process `pid` creates: the prefix
/// "ddp-launch-<pid>-", then a random suffix. The pid ties a segment to the rank that made it.
inline std::string shmSegmentPrefix(pid_t pid) { return "ddp-launch-" + std::to_string(pid) + "-"; }

}  // namespace ddp
