// Runs a real program for a test: output captured, an optional time limit, and its whole
// process group killed and reaped if the test gives up on it. Every test that starts a program
// uses it, but the launcher's own tests (tests/launcher/launched_process.h keeps stdout and
// stderr apart and sets the signal mask ddp-launch is started with).
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ddp::test {

struct CommandResult {
  int exitCode = -1;  // 128 + signal when killed; -1 when it timed out
  std::string output; // stdout and stderr interleaved (stdout only with captureStderr = false)
  bool timedOut = false;
};

/// How runCommand runs a program.
struct CommandOptions {
  int timeoutSeconds = 0;             // 0: no limit of its own (CTest's TIMEOUT still ends the test)
  std::vector<std::string> extraEnv;  // "NAME=value", on top of this process's environment
  bool captureStderr = true;          // false: stderr goes to the test's own, so a Python warning
                                      // cannot spoil the JSON a reference prints on stdout
  std::string stdinPath;              // empty: the test's stdin
};

/// For a reference or tool whose stdout the test parses: stderr passes through, no time limit.
inline CommandOptions stdoutOnly() {
  CommandOptions options;
  options.captureStderr = false;
  return options;
}

namespace detail {

// argv and envp as execve takes them, built before fork: a test with rank threads must not
// allocate in the child while another thread may hold malloc's lock.
struct ExecArgs {
  std::vector<std::string> strings;
  std::vector<char*> argv;
  std::vector<char*> envp;

  ExecArgs(const ExecArgs&) = delete;  // argv and envp point into strings
  ExecArgs(const std::vector<std::string>& args, const std::vector<std::string>& extraEnv) {
    strings = args;
    const auto overridden = [&](const char* entry) {
      for (const auto& kv : extraEnv) {
        const size_t eq = std::min(kv.find('='), kv.size());
        if (std::strncmp(entry, kv.c_str(), eq) == 0 && entry[eq] == '=') return true;
      }
      return false;
    };
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (!overridden(*e)) env.emplace_back(*e);
    }
    for (const auto& kv : extraEnv) {
      if (kv.find('=') != std::string::npos) env.push_back(kv);  // "NAME" alone unsets it, as putenv does
    }
    strings.insert(strings.end(), env.begin(), env.end());
    for (size_t i = 0; i < args.size(); ++i) argv.push_back(strings[i].data());
    argv.push_back(nullptr);
    for (size_t i = args.size(); i < strings.size(); ++i) envp.push_back(strings[i].data());
    envp.push_back(nullptr);
  }
};

// In the child: its own process group (so the test can kill all it started), the given
// descriptors as stdin/stdout/stderr (-1: keep the test's), then the program.
[[noreturn]] inline void execChild(const ExecArgs& exec, int in, int out, int err) {
  ::setpgid(0, 0);
  if (in >= 0) ::dup2(in, 0);
  if (out >= 0) ::dup2(out, 1);
  if (err >= 0) ::dup2(err, 2);
  ::execve(exec.argv[0], exec.argv.data(), exec.envp.data());
  static const char kFailed[] = "execve failed\n";
  [[maybe_unused]] const ssize_t n = ::write(2, kFailed, sizeof kFailed - 1);
  ::_exit(127);
}

}  // namespace detail

/// Runs argv[0] (a path, not looked up in PATH) with the arguments, waits for it and returns
/// what it printed and how it ended.
inline CommandResult runCommand(const std::vector<std::string>& argv, const CommandOptions& options) {
  const detail::ExecArgs exec(argv, options.extraEnv);
  char tmpl[] = "/tmp/ddp_test_out_XXXXXX";
  const int outFd = ::mkostemp(tmpl, O_CLOEXEC);
  if (outFd < 0) throw std::runtime_error(std::string("mkostemp: ") + std::strerror(errno));
  int inFd = -1;
  if (!options.stdinPath.empty()) {
    inFd = ::open(options.stdinPath.c_str(), O_RDONLY | O_CLOEXEC);
    if (inFd < 0) {
      ::close(outFd);
      ::unlink(tmpl);
      throw std::runtime_error("cannot open " + options.stdinPath + ": " + std::strerror(errno));
    }
  }
  const pid_t pid = ::fork();
  if (pid == 0) detail::execChild(exec, inFd, outFd, options.captureStderr ? outFd : -1);
  ::close(outFd);
  if (inFd >= 0) ::close(inFd);
  CommandResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(options.timeoutSeconds);
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (options.timeoutSeconds > 0 && std::chrono::steady_clock::now() > deadline) {
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

/// The end-to-end form: stdout and stderr interleaved, killed after `timeoutSeconds`.
inline CommandResult runCommand(const std::vector<std::string>& argv, int timeoutSeconds,
                                const std::vector<std::string>& extraEnv = {}) {
  CommandOptions options;
  options.timeoutSeconds = timeoutSeconds;
  options.extraEnv = extraEnv;
  return runCommand(argv, options);
}

/// The pids of `parent`'s children (a launcher's workers), from /proc, in ascending order (the order
/// the launcher started them, pids not wrapping); empty once `parent` is gone.
inline std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(parent) + "/task", ec)) {
    std::ifstream in(task.path() / "children");
    for (pid_t p; in >> p;) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// SIGSTOP is delivered asynchronously: returns once /proc shows `pid` stopped (state T) or gone.
inline void waitUntilStopped(pid_t pid) {
  while (true) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) return;  // gone
    const char state = stat[close + 2];
    if (state == 'T' || state == 't' || state == 'Z' || state == 'X') return;
    sched_yield();
  }
}

/// Starts argv[0] in its own process group with stdout and stderr on `outFd` and returns its pid,
/// for a test that reads the output as it comes or signals the program. The caller waits for it
/// and kills its group (-pid).
inline pid_t startInGroup(const std::vector<std::string>& argv, int outFd) {
  const detail::ExecArgs exec(argv, {});
  const pid_t pid = ::fork();
  if (pid == 0) detail::execChild(exec, -1, outFd, outFd);
  return pid;
}

/// Runs argv in its own process group and sends `signal` to it (the launcher, or a lone worker) once
/// its output holds `marker` (e.g. "step 25/"), then reads to the end (every writer gone, so no
/// process blocks on a full pipe). `signalled` is false when the program ended before the marker.
struct SignalledRun {
  bool signalled = false;
  int status = 0;  // waitpid's
  std::string output;
};
inline SignalledRun runSignalledAt(const std::vector<std::string>& argv, const std::string& marker, int signal) {
  SignalledRun run;
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  const pid_t pid = startInGroup(argv, out[1]);
  ::close(out[1]);
  char chunk[4096];
  for (ssize_t n; (n = ::read(out[0], chunk, sizeof chunk)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    run.output.append(chunk, static_cast<size_t>(n));
    if (!run.signalled && run.output.find(marker) != std::string::npos) {
      ::kill(pid, signal);
      run.signalled = true;
    }
  }
  ::close(out[0]);
  if (!run.signalled) ::kill(-pid, SIGKILL);
  ::waitpid(pid, &run.status, 0);
  return run;
}

/// argv that runs `command` through /bin/sh (for a command line with pipes or PATH look-ups).
inline std::vector<std::string> shellCommand(const std::string& command) { return {"/bin/sh", "-c", command}; }

/// A fresh directory under the system temp dir, "ddp_<tag>_XXXXXX".
inline std::string makeTempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("ddp_" + tag + "_XXXXXX")).string();
  return ::mkdtemp(tmpl.data());
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
    const int fd = ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + logPath + ": " + std::strerror(errno));
    pid = startInGroup(argv, fd);
    ::close(fd);
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
