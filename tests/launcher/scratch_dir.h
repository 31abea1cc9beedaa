// A temporary directory per test, with the file helpers the process tests share.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <sys/types.h>

namespace ddp::launcher::testing {

/// mkdtemp() on construction, removed on destruction. Before removing it, kills what any
/// `pid.*` / `child.*` file inside names, so a failed test leaves no process behind.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  /// Writes an executable `#!/bin/sh` script with `body`; returns its path.
  std::string writeScript(const std::string& name, const std::string& body) const;

  /// Waits until every file in `names` exists; false on timeout.
  bool waitForFiles(const std::vector<std::string>& names, std::chrono::milliseconds timeout) const;

  /// Shell line that writes `value` (e.g. `$$`) to `name.$RANK` atomically (write, then
  /// rename), so waitForFiles() never sees a half-written file.
  std::string publish(const std::string& name, const std::string& value) const;

  /// Reads `prefix.0` .. `prefix.(count-1)` as pids (see publish()).
  std::vector<pid_t> readPids(const std::string& prefix, int count) const;

 private:
  std::string path_;
};

/// The whole file, or "" when it cannot be read.
std::string readFile(const std::string& path);
bool fileExists(const std::string& path);

/// Parses `env` output (NAME=value lines).
std::map<std::string, std::string> parseEnvFile(const std::string& path);

/// Splits on '\n', dropping the empty piece after a final newline.
std::vector<std::string> splitLines(const std::string& text);

/// True when `pid` no longer runs: gone (ESRCH), or a zombie nobody reaped yet. Reaps it
/// when this process is its parent (see becomeSubreaper()).
bool processGone(pid_t pid);

/// Polls processGone() until `timeout`.
bool waitUntilGone(pid_t pid, std::chrono::milliseconds timeout);

/// Makes this process the reaper of orphaned descendants (PR_SET_CHILD_SUBREAPER), so
/// workers' children that outlive them come back here and can be reaped, whatever PID 1 does.
void becomeSubreaper();

}  // namespace ddp::launcher::testing
