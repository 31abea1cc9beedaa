// One job per directory: an flock on a lock file inside it, held for the life of the process (the
// kernel drops it when the process ends, however it ends). The file names the holder's pid, and a
// process that ends normally removes it (releaseDirectoryLocks at exit).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "common/no_follow.h"

namespace ddp {

/// The lock file of a job's output and checkpoint directories: the worker's (output.dir,
/// checkpoint.dir) and ddp::Checkpointer's are one lock, so the two in one process agree and two
/// jobs do not. The launcher's --log_dir has its own (.ddp-launch-logs.lock).
inline constexpr char kJobLockFile[] = ".ddp-launch.lock";

struct DirLock {
  bool held = false;  // this process holds it (now or from an earlier call)
  std::string holder;  // when not: the other holder's pid as its file says ("?" unknown)
  int error = 0;       // when the file cannot be opened: errno (ELOOP: it is a symbolic link)
};

namespace detail {

struct HeldLock {
  std::string path;
  int fd = -1;
  pid_t owner = 0;  // the process that took it
};

// The locks this process took, removed and released when it exits normally. Only by the process
// that took them: a forked child that exits without exec must not remove its parent's.
struct HeldLocks {
  std::vector<HeldLock> locks;
  void release() {
    const pid_t self = ::getpid();
    std::vector<HeldLock> others;
    // Unlinked while still held: a process that opened the old file and locks it after this one
    // closes finds the path gone (or another file there) and starts again (lockDirectory).
    for (const HeldLock& lock : locks) {
      if (lock.owner != self) {
        others.push_back(lock);
        continue;
      }
      ::unlink(lock.path.c_str());
      ::close(lock.fd);
    }
    locks = std::move(others);
  }
  ~HeldLocks() { release(); }
};

inline HeldLocks& heldLocks() {
  static HeldLocks held;
  return held;
}

// What the lock file says of its holder: its pid, then what tells this process from another of the
// same pid in another pid namespace (containers sharing a volume) or boot: the kernel's boot id and
// the process's start time.
inline std::string processIdentity() {
  std::string boot;
  std::string stat;
  char buffer[1024];
  for (auto [file, out] : {std::pair{"/proc/sys/kernel/random/boot_id", &boot}, std::pair{"/proc/self/stat", &stat}}) {
    const int fd = ::open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const ssize_t n = ::read(fd, buffer, sizeof buffer - 1);
    ::close(fd);
    if (n > 0) out->assign(buffer, static_cast<size_t>(n));
  }
  boot = boot.substr(0, boot.find('\n'));
  // /proc/self/stat: "pid (comm) state ..." with the start time the 20th field after the comm.
  std::string start;
  size_t at = stat.rfind(')');
  for (int field = 0; at != std::string::npos && field < 20; ++field) at = stat.find(' ', at + 1);
  if (at != std::string::npos) start = stat.substr(at + 1, stat.find(' ', at + 1) - at - 1);
  return std::to_string(::getpid()) + "\n" + boot + " " + start + "\n";
}

// The lock file's content, up to 255 bytes.
inline std::string lockFileText(int fd) {
  char text[256] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  return n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string();
}

// Whether `fd` is still the file at `path` (a holder that exits removes the path before it unlocks).
inline bool isTheFileAt(int fd, const std::string& path) {
  struct stat open {};
  struct stat named {};
  return ::fstat(fd, &open) == 0 && ::lstat(path.c_str(), &named) == 0 && open.st_dev == named.st_dev &&
         open.st_ino == named.st_ino;
}

}  // namespace detail

/// Takes the lock `dir`/`fileName` (O_NOFOLLOW: never a planted link's target). A second call for
/// the same directory in this process (this code linked twice, into a program and a library,
/// included) is a no-op that succeeds: the file names this process (processIdentity).
inline DirLock lockDirectory(const std::string& dir, const std::string& fileName) {
  const std::string path = dir + "/" + fileName;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return {false, "", errno};
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const std::string text = detail::lockFileText(fd);
      ::close(fd);  // another open file's lock: closing this one leaves it held
      if (text == detail::processIdentity()) return {true, "", 0};
      const std::string pid = text.substr(0, text.find('\n'));
      return {false, pid.empty() ? "?" : pid, 0};
    }
    if (!detail::isTheFileAt(fd, path)) {  // its holder removed it as it exited: take the new one
      ::close(fd);
      continue;
    }
    const std::string mine = detail::processIdentity();
    if (::ftruncate(fd, 0) == 0) (void)::pwrite(fd, mine.data(), mine.size(), 0);
    detail::heldLocks().locks.push_back({path, fd, ::getpid()});  // the fd stays open: the lock lives with the process
    return {true, "", 0};
  }
  return {false, "?", 0};
}

/// Removes and releases every lock this process took (so that a refused run can remove the
/// directories it made); also done when the process exits normally.
inline void releaseDirectoryLocks() { detail::heldLocks().release(); }

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
