#include "ddp/files.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace ddp {
namespace {

std::string errnoText() { return std::strerror(errno); }

// ".<name>.tmp.<pid>" files a killed process left beside `name` (kill -9 during a write). Only
// those of processes that no longer exist: another job writing the same name keeps its own.
void removeStaleTemporaries(const std::filesystem::path& dir, const std::string& name) {
  const std::string prefix = "." + name + ".tmp.";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(prefix, 0) != 0) continue;
    const std::string digits = file.substr(prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) std::filesystem::remove(entry.path(), ec);
  }
}

}  // namespace

void makeDirectories(const std::string& dir, const std::string& settingName) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec && !std::filesystem::is_directory(dir, ec)) ec = std::make_error_code(std::errc::not_a_directory);
  if (ec) {
    std::string reason = ec.message();
    if (ec == std::errc::not_a_directory) {  // "Not a directory" of a path that is none: say which part is a file
      std::error_code ignored;
      for (std::filesystem::path p = dir; !p.empty() && p != p.parent_path(); p = p.parent_path()) {
        if (std::filesystem::exists(p, ignored) && !std::filesystem::is_directory(p, ignored)) {
          reason = "'" + p.string() + "' is a file, not a directory";
          break;
        }
      }
    }
    DDP_THROW(ConfigError, settingName, ": cannot create directory '", dir, "': ", reason, "; set ", settingName,
              " to a writable path");
  }
}

void writeFileAtomic(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (target.filename().empty() || fs::is_directory(target, ec)) {
    DDP_THROW(CheckpointError, "cannot write '", path, "': it is a directory; give the path of a file in it");
  }
  const fs::path tmp = dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  // Errors name the file asked for (the temporary beside it is this function's business).
  const auto cannot = [&](const char* what, const std::string& why) {
    std::string where;
    if (!fs::is_directory(dir, ec)) {
      where = fs::exists(dir, ec) ? std::string("; '").append(dir.string()).append("' is a file, not a directory")
                                  : std::string("; its directory '").append(dir.string()).append("' does not exist");
    }
    DDP_THROW(CheckpointError, "cannot ", what, " '", path, "': ", why, where);
  };

  // A file of its own, never through a link planted under the (predictable) temporary name: what is
  // there goes (unlink removes a link, not its target), then the name is created exclusively.
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) cannot("write", errnoText());
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errnoText();
      ::close(fd);
      ::unlink(tmp.c_str());
      cannot("write", why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = errnoText();
    ::unlink(tmp.c_str());
    cannot("flush", why);
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string why = errnoText();
    ::unlink(tmp.c_str());
    cannot("write", why);
  }
  removeStaleTemporaries(dir, target.filename().string());
  // The rename is durable only once the directory entry is on disk.
  const int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
}

}  // namespace ddp
