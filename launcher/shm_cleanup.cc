#include "launcher/shm_cleanup.h"

#include <signal.h>

#include <cerrno>
#include <ctime>
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

std::vector<std::string> removeOrphanedShmSegments(const std::string& shmDir, double minAgeS) {
  std::vector<std::string> removed;
  std::unique_ptr<DIR, decltype(&::closedir)> dir(::opendir(shmDir.c_str()), &::closedir);
  if (!dir) return removed;
  const std::string prefix = "ddp-launch-";
  const double now = static_cast<double>(std::time(nullptr));
  while (const dirent* entry = ::readdir(dir.get())) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t dash = name.find('-', prefix.size());
    const std::string digits = name.substr(prefix.size(), dash == std::string::npos ? 0 : dash - prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // its maker lives (or a process of that pid does)
    const std::string path = shmDir + "/" + name;
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_uid != ::geteuid()) continue;
    if (now - static_cast<double>(info.st_mtime) < minAgeS) continue;
    if (::unlink(path.c_str()) == 0) removed.push_back(name);
  }
  return removed;
}

}  // namespace ddp::launcher
