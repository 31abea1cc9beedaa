#include "launcher/error_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

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

}  // namespace

ErrorFiles::ErrorFiles() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddp-launch-errors-XXXXXX";
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
