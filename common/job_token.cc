#include "common/job_token.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/sha256.h"

namespace ddp {
namespace {

std::string trimmed(const std::string& text) {
  const char* space = " \t\r\n";
  const size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

std::string howToMake(const std::string& path) {
  return "make one with: (umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > " + path + ")";
}

}  // namespace

std::string newJobToken() { return crypto::toHex(crypto::randomBytes(16)); }

std::string readTokenFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    DDP_THROW(ConfigError, "token file '", path, "': ", std::strerror(errno), "; ", howToMake(path));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    DDP_THROW(ConfigError, "token file '", path, "' is not a regular file; ", howToMake(path));
  }
  if ((info.st_mode & 077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(info.st_mode & 07777));
    DDP_THROW(ConfigError, "token file '", path, "' has mode ", mode,
              ": others on this machine could read the job's secret; run: chmod 600 ", path);
  }
  std::string text;
  char buffer[4096];
  ssize_t got = 0;
  while ((got = ::read(fd, buffer, sizeof(buffer))) > 0 && text.size() < (1 << 16)) text.append(buffer, got);
  ::close(fd);
  return checkedToken(trimmed(text), "token file '" + path + "'");
}

std::string checkedToken(const std::string& token, const std::string& source) {
  if (token.size() < kMinTokenChars) {
    DDP_THROW(ConfigError, source, " holds ", token.size(), " characters; a job token needs at least ",
              kMinTokenChars, " random ones (e.g. 32 hex digits from /dev/urandom)");
  }
  return token;
}

}  // namespace ddp
