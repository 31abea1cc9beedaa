// Copying the workers' output to the launcher's, one prefixed line at a time.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace ddp::launcher {

/// Reads every worker's stdout and stderr pipe on one background thread (poll) and writes
/// each line as `[rank N] line` to the launcher's stdout or stderr, only whole lines per
/// write(2) so lines from different ranks never mix. A line without its newline at EOF
/// gets one; a line longer than kMaxLineBytes is cut into several.
class OutputRelay {
 public:
  static constexpr size_t kMaxLineBytes = 64 * 1024;

  /// `stdoutFd`/`stderrFd`: where lines go (the launcher's own by default; tests pass pipes).
  explicit OutputRelay(int stdoutFd = STDOUT_FILENO, int stderrFd = STDERR_FILENO);
  /// Same as finish().
  ~OutputRelay();
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  /// Takes ownership of `fd`, the read end of rank `rank`'s stdout (toStderr false) or
  /// stderr pipe. Call before start().
  void add(int fd, int rank, bool toStderr);

  /// Starts the reading thread.
  void start();

  /// Copies what is left in the pipes, then stops and closes them. Call after every worker
  /// has exited: a pipe a worker's orphaned child still holds open is not waited for.
  void finish();

 private:
  struct Source {
    int fd = -1;
    std::string prefix;  // "[rank N] "
    bool toStderr = false;
    std::string pending;  // bytes after the last newline
  };

  void loop();
  // Reads what is available now; false at EOF or error.
  bool readAvailable(Source& source);
  void emitLines(Source& source, bool flushPartial);
  void writeAll(bool toStderr, const std::string& text);
  void close(Source& source);

  int stdoutFd_;
  int stderrFd_;
  int wakeRead_ = -1;   // finish() writes a byte here to stop the thread
  int wakeWrite_ = -1;
  std::vector<Source> sources_;
  bool broken_[2] = {false, false};  // stdout, stderr: stop writing after EPIPE and the like
  std::thread thread_;
};

}  // namespace ddp::launcher
