#include "launcher/error_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/temp_dir.h"

namespace ddp::launcher {
namespace {

// An error file is a message and a traceback; more is not read.
constexpr size_t kMaxErrorFileBytes = 256 * 1024;

std::string readSmallFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return "";
  std::string text;
  char buffer[4096];
  ssize_t got = 0;
  while (text.size() < kMaxErrorFileBytes && (got = ::read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, got);
  ::close(fd);
  return text;
}

// `  File "train.py", line 12, in main` -> `train.py, line 12, in main`: the traceback's last frame.
std::string innermostFrame(const std::string& traceback) {
  std::istringstream lines(traceback);
  std::string frame;
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find("File \"");
    if (at == std::string::npos) continue;
    std::string text = line.substr(at + 6);
    const size_t quote = text.find('"');
    if (quote != std::string::npos) text.erase(quote, 1);
    frame = text;
  }
  return frame;
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }


// "ddp-launch-errors-<host>-<pid namespace>-": the directories of launchers whose pids this one
// can look up (a $TMPDIR on a shared file system holds other hosts' too, a /tmp shared between
// containers other pid namespaces': their pids mean nothing here).
std::string hostPrefix() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string name(host);
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  char link[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);  // "pid:[4026531836]"
  std::string ns;
  for (ssize_t i = 0; i < n; ++i) {
    if (link[i] >= '0' && link[i] <= '9') ns += link[i];
  }
  return "ddp-launch-errors-" + name + "-" + (ns.empty() ? "0" : ns) + "-";
}

// A launcher killed by SIGKILL (or the OOM killer) cannot remove its directory: the next one on the
// host removes those whose launcher (the pid in the name) is gone, if they are this user's.
void removeOrphanedErrorDirs(const std::string& tmp, const std::string& prefix) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // "<pid>-XXXXXX"
    const size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos || rest.find_first_not_of("0123456789") != dash || dash > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(rest.substr(0, dash)));
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to signal: alive)
    std::error_code ignored;
    std::filesystem::remove_all(entry.path(), ignored);
  }
}

}  // namespace

ErrorFiles::ErrorFiles() {
  const std::string tmp = ddp::temporaryRoot();
  const std::string prefix = hostPrefix();
  removeOrphanedErrorDirs(tmp, prefix);
  std::string pattern = tmp + "/" + prefix + std::to_string(::getpid()) + "-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  if (::mkdtemp(name.data()) != nullptr) dir_ = name.data();  // mkdtemp: mode 700
}

ErrorFiles::~ErrorFiles() {
  if (dir_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string ErrorFiles::pathFor(int rank) const {
  return dir_.empty() ? "" : dir_ + "/rank_" + std::to_string(rank) + ".json";
}

std::string readErrorFile(const std::string& path) {
  if (path.empty()) return "";
  const std::string text = readSmallFile(path);
  if (text.empty()) return "";
  const nlohmann::json data = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!data.is_object() || !data.contains("message")) return "";
  const nlohmann::json& message = data["message"];
  if (message.is_string()) return firstLine(message.get<std::string>());
  if (!message.is_object()) return "";
  std::string out;
  if (message.contains("message") && message["message"].is_string()) out = firstLine(message["message"].get<std::string>());
  if (message.contains("extraInfo") && message["extraInfo"].is_object() && message["extraInfo"].contains("py_callstack") &&
      message["extraInfo"]["py_callstack"].is_string()) {
    const std::string frame = innermostFrame(message["extraInfo"]["py_callstack"].get<std::string>());
    if (!frame.empty()) out += (out.empty() ? "" : " ") + std::string("(") + frame + ")";
  }
  return out;
}

}  // namespace ddp::launcher
