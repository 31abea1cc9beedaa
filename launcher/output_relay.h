// Copying the workers' output to the launcher's, one prefixed line at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace ddp::launcher {

/// Where an OutputRelay writes.
struct OutputRelayOptions {
  int stdoutFd = STDOUT_FILENO;  // prefixed copies of the workers' stdout lines
  int stderrFd = STDERR_FILENO;  // prefixed copies of the workers' stderr lines
  bool console = true;           // false: lines go only to the log files (--log_dir without --tee)
  size_t tailLines = 5;          // last lines kept per rank for the failure summary
};

/// Reads every worker's stdout and stderr pipe on one background thread (poll) and writes
/// each line as `[rank N] line` to the launcher's stdout or stderr, only whole lines per
/// write(2) so lines from different ranks never mix. A line without its newline at EOF
/// gets one; a line longer than kMaxLineBytes is cut into several. A rank with a log file
/// also gets its lines there, raw (no prefix), stdout and stderr together.
class OutputRelay {
 public:
  static constexpr size_t kMaxLineBytes = 64 * 1024;
  /// Longer lines are cut in the tail kept for the summary (not in the output itself).
  static constexpr size_t kMaxTailLineBytes = 400;

  /// `stdoutFd`/`stderrFd`: where lines go (the launcher's own by default; tests pass pipes).
  explicit OutputRelay(int stdoutFd = STDOUT_FILENO, int stderrFd = STDERR_FILENO);
  explicit OutputRelay(const OutputRelayOptions& options);
  /// Same as finish().
  ~OutputRelay();
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  /// Takes ownership of `fd`, the read end of rank `rank`'s stdout (toStderr false) or
  /// stderr pipe. Call before start().
  void add(int fd, int rank, bool toStderr);

  /// Takes ownership of `fd`, a file rank `rank`'s raw lines are appended to. Call before start().
  void addLogFile(int rank, int fd);

  /// Starts the reading thread.
  void start();

  /// Copies what is left in the pipes, then stops and closes them. Call after every worker
  /// has exited: a pipe a worker's orphaned child still holds open is not waited for.
  /// `consoleLimit`: how long a console that takes nothing (stdout a full pipe nobody reads, as
  /// `ddp-launch ... | sleep 100` after a SIGTERM) may hold the end up; past it the console's rest
  /// is dropped (the log files still get everything). Unlimited by default: a slow reader such as
  /// `| less` gets all of it.
  void finish(std::chrono::milliseconds consoleLimit = std::chrono::milliseconds::max());

  /// The last (up to tailLines) lines rank `rank` wrote, oldest first, stdout and stderr
  /// mixed in the order read. Call after finish().
  std::vector<std::string> lastLines(int rank) const;

 private:
  struct Source {
    int fd = -1;
    int rank = 0;
    bool toStderr = false;
    std::string pending;  // bytes after the last newline
  };
  struct RankOutput {
    std::string prefix;  // "[rank N] "
    int logFd = -1;
    bool logBroken = false;
    std::deque<std::string> tail;
  };

  void loop();
  // Whether the console writes were given up on (finish's consoleLimit): set by finish(), read by
  // the relay thread, whose blocked write() a signal then interrupts.
  std::atomic<bool> abandonConsole_{false};
  std::atomic<bool> loopDone_{false};
  // Reads what is available now; false at EOF or error.
  bool readAvailable(Source& source);
  void emitLines(Source& source, bool flushPartial);
  // Writes all of `text` to `fd` unless `broken`; sets `broken` on EPIPE and the like.
  void writeAll(int fd, bool& broken, const std::string& text);
  void close(Source& source);
  RankOutput& rankOutput(int rank);

  OutputRelayOptions options_;
  int wakeRead_ = -1;   // finish() writes a byte here to stop the thread
  int wakeWrite_ = -1;
  std::vector<Source> sources_;
  std::map<int, RankOutput> ranks_;
  bool broken_[2] = {false, false};  // stdout, stderr: stop writing after EPIPE and the like
  // A worker's progress bar (text ending in '\r', not '\n') is on the console: the next line of
  // any rank first erases it. Status text goes to the console only, never to logs or the tail.
  bool statusShown_ = false;
  std::thread thread_;
};

}  // namespace ddp::launcher
