// RAII handle on one run of the built ddp-launch binary, for the process tests.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace ddp::launcher::testing {

/// How to run ddp-launch.
struct LaunchSpec {
  std::vector<std::string> args;  // after argv[0]
  // On top of this test's environment: a value sets the variable, nullopt removes it.
  std::map<std::string, std::optional<std::string>> env;
  std::string outputDir;        // stdout/stderr land in outputDir/<name>.out and .err
  std::string name = "launch";
  int stdoutFd = -1;  // >= 0: the launcher's stdout is this fd (a pipe's write end), not a file
};

/// Starts DDP_LAUNCH_BIN with default signal dispositions and an empty mask (as from a
/// shell prompt), stdin from /dev/null. The destructor SIGKILLs and reaps it if it still
/// runs, so a failing assertion never leaves it behind.
class LaunchedProcess {
 public:
  explicit LaunchedProcess(const LaunchSpec& spec);
  ~LaunchedProcess();
  LaunchedProcess(const LaunchedProcess&) = delete;
  LaunchedProcess& operator=(const LaunchedProcess&) = delete;

  pid_t pid() const { return pid_; }

  /// Waits for the exit; returns the shell-style code (128 + signal when killed), or
  /// nullopt if it still runs after `timeout`.
  std::optional<int> waitFor(std::chrono::milliseconds timeout);

  void sendSignal(int signal) const;

  std::string stdoutText() const;
  std::string stderrText() const;

  /// Waits until the launcher's stderr contains `text` (an event it reports, e.g. that it
  /// received a signal); false if it has not after `timeout` or the launcher exited first.
  bool waitForStderr(const std::string& text, std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::optional<int> code_;
  std::string stdoutPath_;
  std::string stderrPath_;
};

/// The outcome of a finished run.
struct LaunchResult {
  std::optional<int> code;  // nullopt: timed out (and was killed)
  std::string out;
  std::string err;
  std::chrono::duration<double> elapsed{};
};

/// Runs ddp-launch to the end (or `timeout`) and collects its output.
LaunchResult runLauncher(const LaunchSpec& spec, std::chrono::milliseconds timeout = std::chrono::seconds(20));

}  // namespace ddp::launcher::testing
