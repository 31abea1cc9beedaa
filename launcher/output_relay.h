// Copying the workers' output to the launcher's, one prefixed line at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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
  // Whether stdoutFd / stderrFd is a terminal, where a line a worker redraws with '\r' is shown
  // in place as it changes. Unset: isatty() decides. Files and pipes get finished lines only.
  std::optional<bool> stdoutIsTerminal;
  std::optional<bool> stderrIsTerminal;
};

/// Reads every worker's stdout and stderr pipe on one background thread (poll) and writes
/// each line as `[rank N] line` to the launcher's stdout or stderr, only whole lines per
/// write(2) so lines from different ranks never mix. A line without its newline at EOF
/// gets one; a line longer than kMaxLineBytes is cut into several. A rank with a log file
/// also gets its lines there, raw (no prefix), stdout and stderr together.
///
/// Redraws: a line is what follows its last '\r' ("\r\n" is a plain line end), so files,
/// pipes, log files and the summary's tail get each redrawn line once, in its final state, and
/// no escape sequence. A terminal also sees the unfinished line's latest redraw drawn in place.
/// A line starting with PyTorch's own prefix for the same rank ("[rank1]:") loses it on the
/// console: one prefix, ours.
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

  /// Keeps rank `rank`'s lines off the console (--local_ranks_filter, --ranks_filter); its log
  /// file and the summary's tail still get them. Call before start().
  void hideFromConsole(int rank);

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
  /// mixed in the order read. When the rank died of an uncaught C++ exception, whose message
  /// ("  what():  ...") a backtrace of LibTorch's pushes out of the tail, that line comes first
  /// in place of the oldest. Call after finish().
  std::vector<std::string> lastLines(int rank) const;

 private:
  struct Source {
    int fd = -1;
    int rank = 0;
    bool toStderr = false;
    std::string pending;  // the unfinished line: bytes after the last newline, older redraws dropped
  };
  struct RankOutput {
    std::string prefix;       // "[rank N] "
    std::string torchPrefix;  // "[rankN]:", what PyTorch's logging puts before its lines
    int logFd = -1;
    bool logBroken = false;
    bool hidden = false;      // not on the console (hideFromConsole)
    std::deque<std::string> tail;
    // The last "terminate called ..." / "  what():  ..." line: std::terminate's report of an
    // uncaught exception, the one line that says why, above a backtrace that may fill the tail.
    std::string uncaught;
  };

  void loop();
  // Whether the console writes were given up on (finish's consoleLimit): set by finish(), read by
  // the relay thread, whose blocked write() a signal then interrupts.
  std::atomic<bool> abandonConsole_{false};
  std::atomic<bool> loopDone_{false};
  // Reads what is available now; false at EOF or error.
  bool readAvailable(Source& source);
  // Turns the finished lines in `source.pending` (all of it when `atEnd`) into output.
  void emitLines(Source& source, bool atEnd);
  // What one call of emitLines writes: console lines, log-file lines.
  struct Lines {
    std::string console;
    std::string raw;
  };
  // Adds the finished line `text`, in pieces of at most kMaxLineBytes.
  void addLine(RankOutput& output, std::string_view text, Lines& lines);
  // Shrinks the unfinished line to what can still show; returns its latest complete redraw.
  std::string compactUnfinished(RankOutput& output, std::string& line, Lines& lines);
  // Adds all but the last (up to kMaxLineBytes) bytes of the unfinished `text` as cut lines: text
  // that long is not waited for (the relay's memory stays bounded), as a finished line is cut.
  void cutOverlong(RankOutput& output, std::string& text, Lines& lines);
  // Writes `lines` and, on a terminal, draws `redraw` in place.
  void writeOut(const Source& source, RankOutput& output, const Lines& lines, const std::string& redraw);
  // Erases the redraw on the terminal it is drawn on, if one is.
  void eraseRedraw();
  // Writes all of `text` to `fd` unless `broken`; sets `broken` on EPIPE and the like.
  /// Writes all of `text` unless `broken`; a failure (EPIPE, ENOSPC) sets `broken` and returns its errno.
  int writeAll(int fd, bool& broken, const std::string& text);
  void close(Source& source);
  RankOutput& rankOutput(int rank);

  OutputRelayOptions options_;
  int wakeRead_ = -1;   // finish() writes a byte here to stop the thread
  int wakeWrite_ = -1;
  std::vector<Source> sources_;
  std::map<int, RankOutput> ranks_;
  bool broken_[2] = {false, false};    // stdout, stderr: stop writing after EPIPE and the like
  bool terminal_[2] = {false, false};  // stdout, stderr: draws redraws in place
  // A worker's progress bar (text ending in '\r', not '\n') is drawn on a terminal (stream
  // redrawStream_, 0 stdout, 1 stderr, -1 none): the next line to a terminal first erases it.
  // Redraws go to terminals only, never to files, pipes, logs or the tail.
  int redrawStream_ = -1;
  std::string redrawShown_;  // the bytes drawn, so an unchanged redraw is not drawn again
  std::thread thread_;
};

}  // namespace ddp::launcher
