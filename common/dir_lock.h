// One job per directory: an flock on a lock file inside it, held for the life of the process (the
// kernel drops it when the process ends, however it ends). The file names the holder's pid.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <set>
#include <string>

#include "common/no_follow.h"

namespace ddp {

struct DirLock {
  bool held = false;  // this process holds it (now or from an earlier call)
  std::string holder;  // when not: the other holder's pid as its file says ("?" unknown)
  int error = 0;       // when the file cannot be opened: errno (ELOOP: it is a symbolic link)
};

/// Takes the lock `dir`/`fileName` (O_NOFOLLOW: never a planted link's target). A second call for
/// the same directory in this process is a no-op that succeeds.
inline DirLock lockDirectory(const std::string& dir, const std::string& fileName) {
  static std::set<std::string> held;  // by real path and lock name
  std::error_code ignored;
  const std::string key = std::filesystem::weakly_canonical(dir, ignored).string() + "\n" + fileName;
  if (held.count(key) != 0) return {true, "", 0};
  const std::string path = dir + "/" + fileName;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return {false, "", errno};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char owner[32] = {};
    const ssize_t n = ::pread(fd, owner, sizeof owner - 1, 0);
    ::close(fd);
    std::string pid = n > 0 ? std::string(owner, static_cast<size_t>(n)) : std::string("?");
    return {false, pid.substr(0, pid.find('\n')), 0};
  }
  const std::string mine = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) (void)::pwrite(fd, mine.data(), mine.size(), 0);
  held.insert(key);  // the fd stays open: the lock lives as long as the process
  return {true, "", 0};
}

/// Why lockDirectory(dir, fileName) refused, for one line after "<setting> <dir>": "" when it did
/// not (held, or not openable: a read-only place fails its own write check with the reason).
inline std::string dirLockRefusal(const DirLock& lock, const std::string& dir, const std::string& fileName,
                                  const std::string& setting) {
  const std::string path = dir + "/" + fileName;
  if (lock.error == ELOOP) return ": " + path + ": " + openFailure(ELOOP);
  if (!lock.held && lock.error == 0) {
    return " is in use by another job (pid " + lock.holder + " holds " + path + "); give each job its own " + setting;
  }
  return "";
}

}  // namespace ddp
