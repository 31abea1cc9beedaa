// Removing the shared-memory segments a job's workers left behind.
#pragma once

#include <string>
#include <vector>

#include <sys/types.h>

namespace ddp::launcher {

/// Unlinks every segment in `shmDir` that a process in `pids` created (see
/// ddp::shmSegmentPrefix). A worker unlinks its segment itself once every rank has mapped it;
/// one killed before that (SIGKILL, a signal during start-up) leaves it, and this removes it.
/// Call it while the workers are unreaped zombies, so none of the pids can have been reused.
/// Returns the names removed.
std::vector<std::string> removeShmSegments(const std::vector<pid_t>& pids, const std::string& shmDir = "/dev/shm");

}  // namespace ddp::launcher
