// Runs a real program for an end-to-end test: output captured, a time limit,
// and its whole process group killed and reaped if the test gives up on it.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ddp::test {

struct CommandResult {
  int exitCode = -1;  // 128 + signal when killed; -1 when it timed out
  std::string output; // stdout and stderr interleaved
  bool timedOut = false;
};

inline CommandResult runCommand(const std::vector<std::string>& argv, int timeoutSeconds,
                                const std::vector<std::string>& extraEnv = {}) {
  char tmpl[] = "/tmp/ddp_test_out_XXXXXX";
  const int outFd = ::mkstemp(tmpl);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(outFd, 1);
    ::dup2(outFd, 2);
    for (const auto& kv : extraEnv) ::putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::perror("execv");
    ::_exit(127);
  }
  ::close(outFd);
  CommandResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds);
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      result.timedOut = true;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!result.timedOut) {
    result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::ifstream in(tmpl);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  ::unlink(tmpl);
  return result;
}

/// A fresh directory under the system temp dir, "ddp_<tag>_XXXXXX".
inline std::string makeTempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("ddp_" + tag + "_XXXXXX")).string();
  return ::mkdtemp(tmpl.data());
}

/// A loopback port the kernel just chose and released: free unless another process races for it
/// (for programs that need a port number up front and bind it themselves).
inline uint16_t freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// A program running in its own process group while the test goes on, its output in `log`;
/// killed with its group and reaped if the test leaves it behind.
struct Background {
  pid_t pid = -1;
  std::string log;
  Background(const std::vector<std::string>& argv, const std::string& logPath) : log(logPath) {
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> a;
      for (auto s : argv) a.push_back(::strdup(s.c_str()));
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      ::_exit(127);
    }
  }
  bool waitFor(const std::string& text, int seconds) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (readFile(log).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  int wait(int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        pid = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  ~Background() {
    if (pid > 0) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

}  // namespace ddp::test
