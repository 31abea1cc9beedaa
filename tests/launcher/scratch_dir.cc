#include "tests/launcher/scratch_dir.h"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <dirent.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace ddp::launcher::testing {
namespace {

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
  }
  return names;
}

}  // namespace

ScratchDir::ScratchDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/ddp-launch-test.XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  for (const std::string& name : listDir(path_)) {
    if (name.rfind("pid.", 0) != 0 && name.rfind("child.", 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(readFile(file(name)).c_str()));
    if (pid <= 1 || processGone(pid)) continue;
    ::kill(-pid, SIGKILL);  // workers lead their own process group
    ::kill(pid, SIGKILL);
    waitUntilGone(pid, std::chrono::seconds(2));
  }
  for (const std::string& name : listDir(path_)) ::unlink(file(name).c_str());
  ::rmdir(path_.c_str());
}

std::string ScratchDir::writeScript(const std::string& name, const std::string& body) const {
  const std::string path = file(name);
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

bool ScratchDir::waitForFiles(const std::vector<std::string>& names, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    bool all = true;
    for (const std::string& name : names) all = all && fileExists(file(name));
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string ScratchDir::publish(const std::string& name, const std::string& value) const {
  const std::string target = "\"" + path_ + "/" + name + ".$RANK\"";
  const std::string staging = "\"" + path_ + "/.staging." + name + ".$RANK\"";
  return "echo " + value + " > " + staging + " && mv " + staging + " " + target + "\n";
}

std::vector<pid_t> ScratchDir::readPids(const std::string& prefix, int count) const {
  std::vector<pid_t> pids;
  for (int i = 0; i < count; ++i) {
    pids.push_back(static_cast<pid_t>(std::atoi(readFile(file(prefix + "." + std::to_string(i))).c_str())));
  }
  return pids;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool fileExists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

std::map<std::string, std::string> parseEnvFile(const std::string& path) {
  std::map<std::string, std::string> env;
  for (const std::string& line : splitLines(readFile(path))) {
    const size_t equals = line.find('=');
    if (equals != std::string::npos) env[line.substr(0, equals)] = line.substr(equals + 1);
  }
  return env;
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool processGone(pid_t pid) {
  if (::waitpid(pid, nullptr, WNOHANG) == pid) return true;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  // Field 3 of /proc/PID/stat is the state; the command before it is in parentheses.
  const std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return stat.empty() || (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z');
}

bool waitUntilGone(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!processGone(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void becomeSubreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

}  // namespace ddp::launcher::testing
