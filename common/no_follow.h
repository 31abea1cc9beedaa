// Files the job writes by name (logs, metrics, lock files) must be its own: a symbolic link planted
// where one goes would make the job write, or truncate, whatever the link points at.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ddp {

/// Opens `path` for writing without following a symbolic link there (O_NOFOLLOW), creating it (0644)
/// when missing; `append` keeps its content, else it is truncated. Returns the fd, or -1 with errno
/// (ELOOP: `path` is a link).
inline int openForWriting(const std::string& path, bool append) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (append ? O_APPEND : O_TRUNC), 0644);
}

/// Why openForWriting() failed, for a one-line error: a link is named as one.
inline std::string openFailure(int error) {
  return error == ELOOP ? std::string("it is a symbolic link (the job never writes through a link it did not make; "
                                      "remove it)")
                        : std::string(std::strerror(error));
}

/// Makes `path` a file of the job's own before a stream opens it by name: created when missing,
/// refused when it is a symbolic link. "" on success, else the reason (openFailure()).
inline std::string claimFile(const std::string& path, bool append) {
  const int fd = openForWriting(path, append);
  if (fd < 0) return openFailure(errno);
  ::close(fd);
  return "";
}

/// Which file a path names (device and inode): a record opened once can tell that its file was
/// deleted or replaced since (output.dir removed while the job runs).
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId& other) const { return dev == other.dev && ino == other.ino; }
  bool operator!=(const FileId& other) const { return !(*this == other); }
};

/// The file `path` names now, not following a link there; FileId{} when there is none.
inline FileId fileIdOf(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return FileId{};
  return FileId{st.st_dev, st.st_ino};
}

}  // namespace ddp
