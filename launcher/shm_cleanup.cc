#include "launcher/shm_cleanup.h"

#include <cerrno>
#include <cstring>
#include <memory>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/shm_segment_name.h"

namespace ddp::launcher {

std::vector<std::string> removeShmSegments(const std::vector<pid_t>& pids, const std::string& shmDir) {
  std::vector<std::string> removed;
  std::unique_ptr<DIR, decltype(&::closedir)> dir(::opendir(shmDir.c_str()), &::closedir);
  if (!dir) return removed;  // no /dev/shm: no shm backend either
  std::vector<std::string> prefixes;
  for (pid_t pid : pids) prefixes.push_back(shmSegmentPrefix(pid));
  while (const dirent* entry = ::readdir(dir.get())) {
    const std::string name = entry->d_name;
    for (const std::string& prefix : prefixes) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string path = shmDir + "/" + name;
      // Only this user's: a name like a worker's that another user made there is theirs to keep.
      struct stat info {};
      if (::lstat(path.c_str(), &info) != 0 || info.st_uid != ::geteuid()) break;
      if (::unlink(path.c_str()) == 0) {
        spdlog::debug("removed {} that a worker left behind", path);
        removed.push_back(name);
      } else if (errno != ENOENT) {
        spdlog::warn("cannot remove the shared-memory segment {} a worker left ({}); remove it by hand", path,
                     std::strerror(errno));
      }
      break;
    }
  }
  return removed;
}

}  // namespace ddp::launcher
