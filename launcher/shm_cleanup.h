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

/// Unlinks this user's segments in `shmDir` left by a job whose launcher was killed with its workers
/// during start-up (a scheduler's SIGKILL of the whole step: nobody was left to remove them): those
/// whose creating process is gone and that are older than `minAgeS` (a live job's segment is
/// unlinked once its ranks have mapped it, within its start-up; the age guards a job of another
/// pid namespace sharing /dev/shm under the same user, whose pids mean nothing here, unless its
/// ranks take longer than that to meet). Returns the names removed.
std::vector<std::string> removeOrphanedShmSegments(const std::string& shmDir = "/dev/shm", double minAgeS = 3600);

}  // namespace ddp::launcher
