#include "common/job_token.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
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

constexpr std::size_t kMaxTokenFileBytes = 1 << 16;

// UTF-8 text without control characters but whitespace: a token typed or written as text (hex,
// base64, a passphrase, in any language), whose surrounding whitespace (the trailing newline an
// editor adds) is not part of it.
bool isTextToken(const std::string& raw) {
  for (size_t i = 0; i < raw.size();) {
    const auto c = static_cast<unsigned char>(raw[i]);
    if (c < 0x80) {
      if ((c < 0x20 || c == 0x7f) && c != '\t' && c != '\n' && c != '\r') return false;
      ++i;
      continue;
    }
    // A multi-byte sequence: its length from the lead byte, continuation bytes 10xxxxxx, no
    // overlong form, no surrogate, nothing past U+10FFFF, no C1 control (U+0080..U+009F).
    const size_t length = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (length == 0 || c > 0xf4 || i + length > raw.size()) return false;
    uint32_t code = c & (0x7f >> length);
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(raw[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    const uint32_t smallest = length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000;
    if (code < smallest || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff) || code < 0xa0) return false;
    i += length;
  }
  return true;
}

std::string howToMake(const std::string& path) {
  return "make one with: (umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > " + path + ")";
}

// A Kubernetes Secret volume (and a ConfigMap's, or a projected one): a read-only tmpfs that only
// the pod's containers see, its files root-owned, mode 0644 unless the manifest's defaultMode says
// otherwise. Nobody outside the pod can read it and nobody inside can change it, so its mode's read
// bits do not matter; no write bit but the owner's is accepted.
bool onSecretVolume(int fd, const struct stat& info) {
  if (info.st_uid != 0 || (info.st_mode & 022) != 0) return false;
  struct statfs fs {};
  struct statvfs vfs {};
  return ::fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC && ::fstatvfs(fd, &vfs) == 0 &&
         (vfs.f_flag & ST_RDONLY) != 0;
}

}  // namespace

std::string newJobToken() { return crypto::toHex(crypto::randomBytes(16)); }

std::string readTokenFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below, as a device is).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    DDP_THROW(ConfigError, "token file '", path, "': ", std::strerror(errno), "; ", howToMake(path));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    DDP_THROW(ConfigError, "token file '", path, "' is not a regular file; ", howToMake(path));
  }
  // Whoever owns the file can rewrite the secret (or chmod it): the caller, or root (a secret mount).
  const uid_t me = ::geteuid();
  if (info.st_uid != me && info.st_uid != 0) {
    ::close(fd);
    DDP_THROW(ConfigError, "token file '", path, "' belongs to user id ", info.st_uid, ", not to this user (",
              me, ") or root: its owner could change the job's secret; use a token file of your own");
  }
  if ((info.st_mode & 077) != 0 && !onSecretVolume(fd, info)) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(info.st_mode & 07777));
    DDP_THROW(ConfigError, "token file '", path, "' has mode ", mode,
              ": others on this machine could read the job's secret; run: chmod 600 ", path,
              " (in Kubernetes: mount the Secret as a volume, a read-only tmpfs whose root-owned files are "
              "accepted at any mode without group or other write bits, or pass it as DDP_RDZV_TOKEN from a "
              "secretKeyRef)");
  }
  const std::string source = "token file '" + path + "'";
  if (info.st_size > static_cast<off_t>(kMaxTokenFileBytes)) {
    ::close(fd);
    DDP_THROW(ConfigError, source, " is over 64 KiB; a job token is a short secret");
  }
  std::string raw;
  char buffer[4096];
  ssize_t got = 0;
  while ((got = ::read(fd, buffer, sizeof(buffer))) > 0 && raw.size() < kMaxTokenFileBytes) raw.append(buffer, got);
  ::close(fd);
  if (isTextToken(raw)) return checkedToken(trimmed(raw), source);
  // Raw bytes (head -c 32 /dev/urandom): the whole file, hex-encoded, so that no NUL or newline in
  // it cuts the secret short where it travels (the workers' environment, the store's handshake).
  if (raw.size() < kMinTokenChars) {
    DDP_THROW(ConfigError, source, " holds ", raw.size(), " bytes; a job token needs at least ", kMinTokenChars,
              " random ones (e.g. head -c 32 /dev/urandom)");
  }
  return checkedToken(crypto::toHex(raw), source);
}

std::string checkedToken(const std::string& token, const std::string& source) {
  if (token.size() < kMinTokenChars) {
    DDP_THROW(ConfigError, source, " holds ", token.size(), " characters; a job token needs at least ",
              kMinTokenChars, " random ones (e.g. 32 hex digits from /dev/urandom)");
  }
  if (token.find_first_not_of(token.front()) == std::string::npos) {
    DDP_THROW(ConfigError, source, " holds one character repeated, which anyone could guess; a job token needs ",
              kMinTokenChars, " random ones (e.g. 32 hex digits from /dev/urandom)");
  }
  // A short pattern repeated ("abababab...", "passwordpassword") or a handful of characters: as
  // guessable. (16 random hex digits repeat a pattern of 8 or hold under 5 kinds with odds below 1e-6.)
  for (size_t period = 2; period <= 8 && period < token.size(); ++period) {
    bool repeats = true;
    for (size_t i = period; i < token.size() && repeats; ++i) repeats = token[i] == token[i - period];
    if (repeats) {
      DDP_THROW(ConfigError, source, " holds a pattern of ", period, " characters repeated, which anyone could guess; ",
                "a job token needs ", kMinTokenChars, " random characters (e.g. 32 hex digits from /dev/urandom)");
    }
  }
  if (std::set<char>(token.begin(), token.end()).size() < 5) {
    DDP_THROW(ConfigError, source, " holds only ", std::set<char>(token.begin(), token.end()).size(),
              " different characters, which anyone could guess; a job token needs ", kMinTokenChars,
              " random ones (e.g. 32 hex digits from /dev/urandom)");
  }
  return token;
}

}  // namespace ddp
