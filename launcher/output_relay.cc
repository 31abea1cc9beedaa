#include "launcher/output_relay.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include "common/error.h"

namespace ddp::launcher {

namespace {

OutputRelayOptions consoleOptions(int stdoutFd, int stderrFd) {
  OutputRelayOptions options;
  options.stdoutFd = stdoutFd;
  options.stderrFd = stderrFd;
  return options;
}

// Back to the line's start and erase it: how a terminal loses a bar drawn in place.
constexpr std::string_view kEraseLine = "\r\033[K";

// The text a finished line leaves once its redraws are done: what follows its last '\r'.
// '\r's just before the '\n' are part of the line end ("\r\n", or a bar's "text\r" that a
// newline made permanent), not a redraw to nothing.
std::string_view finishedText(std::string_view line) {
  const size_t last = line.find_last_not_of('\r');
  if (last == std::string_view::npos) return {};
  line = line.substr(0, last + 1);
  const size_t carriage = line.rfind('\r');
  return carriage == std::string_view::npos ? line : line.substr(carriage + 1);
}

// PyTorch starts its own log lines with "[rankN]:" (c10's logging "[rank1]:[W127 ...] text",
// torch._logging "[rank1]:W0127 ...", torch.distributed's excepthook "[rank1]: Traceback"): for
// this rank our "[rank N] " says the same, so theirs (and the space after it) goes.
std::string_view withoutTorchPrefix(std::string_view text, std::string_view torchPrefix) {
  if (text.substr(0, torchPrefix.size()) != torchPrefix) return text;
  text.remove_prefix(torchPrefix.size());
  if (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  return text;
}

}  // namespace

OutputRelay::OutputRelay(int stdoutFd, int stderrFd) : OutputRelay(consoleOptions(stdoutFd, stderrFd)) {}

OutputRelay::OutputRelay(const OutputRelayOptions& options) : options_(options) {
  terminal_[0] = options.stdoutIsTerminal.value_or(::isatty(options.stdoutFd) == 1);
  terminal_[1] = options.stderrIsTerminal.value_or(::isatty(options.stderrFd) == 1);
  int fds[2];
  DDP_ENFORCE(::pipe2(fds, O_CLOEXEC) == 0, "pipe2 failed, errno ", errno);
  wakeRead_ = fds[0];
  wakeWrite_ = fds[1];
}

OutputRelay::~OutputRelay() {
  finish();
  ::close(wakeRead_);
  ::close(wakeWrite_);
}

void OutputRelay::add(int fd, int rank, bool toStderr) {
  DDP_ENFORCE(!thread_.joinable(), "OutputRelay::add after start");
  // Non-blocking so the final drain stops at "nothing more now" instead of waiting for EOF.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  Source source;
  source.fd = fd;
  source.rank = rank;
  source.toStderr = toStderr;
  sources_.push_back(std::move(source));
  rankOutput(rank);
}

void OutputRelay::addLogFile(int rank, int fd) {
  DDP_ENFORCE(!thread_.joinable(), "OutputRelay::addLogFile after start");
  RankOutput& output = rankOutput(rank);
  if (output.logFd >= 0) ::close(output.logFd);
  output.logFd = fd;
}

namespace {

// SIGURG interrupts the relay thread's blocked console write (EINTR: no SA_RESTART). Nothing else of
// the launcher uses it, and its default action is to ignore it.
constexpr int kInterruptSignal = SIGURG;
void interrupted(int) {}

}  // namespace

void OutputRelay::start() {
  static const bool installed = [] {
    struct sigaction action {};
    action.sa_handler = interrupted;
    sigemptyset(&action.sa_mask);
    return ::sigaction(kInterruptSignal, &action, nullptr) == 0;
  }();
  (void)installed;
  thread_ = std::thread([this] {
    sigset_t interrupt;
    sigemptyset(&interrupt);
    sigaddset(&interrupt, kInterruptSignal);
    ::pthread_sigmask(SIG_UNBLOCK, &interrupt, nullptr);
    loop();
    loopDone_ = true;
  });
}

void OutputRelay::finish(std::chrono::milliseconds consoleLimit) {
  if (thread_.joinable()) {
    const char byte = 0;
    while (::write(wakeWrite_, &byte, 1) < 0 && errno == EINTR) {
    }
    const auto start = std::chrono::steady_clock::now();
    const bool limited = consoleLimit != std::chrono::milliseconds::max();
    while (!loopDone_) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (limited && waited >= consoleLimit) {
        abandonConsole_ = true;  // then interrupt the write it is blocked in, until it notices
        ::pthread_kill(thread_.native_handle(), kInterruptSignal);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    thread_.join();
  }
  for (Source& source : sources_) close(source);
  eraseRedraw();  // the launcher's own lines start clean
  for (auto& [rank, output] : ranks_) {
    if (output.logFd >= 0) ::close(output.logFd);
    output.logFd = -1;
  }
}

std::vector<std::string> OutputRelay::lastLines(int rank) const {
  const auto found = ranks_.find(rank);
  if (found == ranks_.end()) return {};
  const RankOutput& output = found->second;
  std::vector<std::string> lines(output.tail.begin(), output.tail.end());
  const bool inTail = std::find(lines.begin(), lines.end(), output.uncaught) != lines.end();
  if (!output.uncaught.empty() && !inTail) lines.front() = output.uncaught;  // the tail is full: it was pushed out
  return lines;
}

void OutputRelay::hideFromConsole(int rank) { rankOutput(rank).hidden = true; }

OutputRelay::RankOutput& OutputRelay::rankOutput(int rank) {
  RankOutput& output = ranks_[rank];
  if (output.prefix.empty()) {
    output.prefix = "[rank " + std::to_string(rank) + "] ";
    output.torchPrefix = "[rank" + std::to_string(rank) + "]:";
  }
  return output;
}

void OutputRelay::loop() {
  bool stopping = false;
  while (!stopping) {
    std::vector<pollfd> polled{{wakeRead_, POLLIN, 0}};
    std::vector<Source*> open;
    for (Source& source : sources_) {
      if (source.fd < 0) continue;
      polled.push_back({source.fd, POLLIN, 0});
      open.push_back(&source);
    }
    if (::poll(polled.data(), polled.size(), -1) < 0) {
      // Never give up: a relay that stops reading would block the workers on full pipes.
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    stopping = (polled[0].revents & POLLIN) != 0;
    for (size_t i = 0; i < open.size(); ++i) {
      if (polled[i + 1].revents == 0 && !stopping) continue;
      if (!readAvailable(*open[i])) close(*open[i]);
    }
  }
}

bool OutputRelay::readAvailable(Source& source) {
  char buffer[16 * 1024];
  while (true) {
    const ssize_t count = ::read(source.fd, buffer, sizeof(buffer));
    if (count > 0) {
      source.pending.append(buffer, static_cast<size_t>(count));
      emitLines(source, false);
      continue;
    }
    if (count < 0 && errno == EINTR) continue;
    return count < 0 && errno == EAGAIN;
  }
}

void OutputRelay::emitLines(Source& source, bool atEnd) {
  RankOutput& output = ranks_.at(source.rank);
  Lines lines;
  const std::string_view pending = source.pending;
  size_t begin = 0;
  for (size_t newline = pending.find('\n'); newline != std::string_view::npos; newline = pending.find('\n', begin)) {
    addLine(output, finishedText(pending.substr(begin, newline - begin)), lines);
    begin = newline + 1;
  }
  source.pending.erase(0, begin);
  std::string redraw = compactUnfinished(output, source.pending, lines);
  if (atEnd) {
    // Nobody redraws it any more: what follows its last '\r' is its final text. A line ending in
    // '\r' (a bar waiting for its next redraw, which the terminal erases now) leaves nothing.
    const size_t carriage = source.pending.rfind('\r');
    const size_t from = carriage == std::string::npos ? 0 : carriage + 1;
    if (from < source.pending.size()) addLine(output, std::string_view(source.pending).substr(from), lines);
    source.pending.clear();
    redraw.clear();
  }
  writeOut(source, output, lines, redraw);
}

void OutputRelay::addLine(RankOutput& output, std::string_view text, Lines& lines) {
  do {
    const std::string_view piece = text.substr(0, kMaxLineBytes);  // cut: the relay's memory stays bounded
    text.remove_prefix(piece.size());
    if (options_.console && !output.hidden) {
      lines.console.append(output.prefix).append(withoutTorchPrefix(piece, output.torchPrefix)).push_back('\n');
    }
    if (output.logFd >= 0) lines.raw.append(piece).push_back('\n');
    output.tail.emplace_back(piece.substr(0, kMaxTailLineBytes));
    if (piece.find("what():") != std::string_view::npos || piece.rfind("terminate called", 0) == 0) {
      output.uncaught = output.tail.back();
    }
    if (output.tail.size() > options_.tailLines) output.tail.pop_front();
  } while (!text.empty());
}

std::string OutputRelay::compactUnfinished(RankOutput& output, std::string& line, Lines& lines) {
  const size_t carriage = line.rfind('\r');
  if (carriage == std::string::npos) {
    // Text without its newline yet: a prompt ("(Pdb) ", input()'s) waits for the user, so a terminal
    // shows it now, drawn in place like a bar, and the finished line replaces it once it ends.
    cutOverlong(output, line, lines);
    return line;
  }
  // Only the latest complete redraw and the text after it can still show: a bar redrawn for
  // hours holds no more memory than one redraw. The shorter line has the same final text.
  std::string redraw(finishedText(std::string_view(line).substr(0, carriage + 1)));
  std::string after = line.substr(carriage + 1);
  cutOverlong(output, redraw, lines);  // a long "text\r" may be a long line's "\r\n" to come
  if (after.size() > kMaxLineBytes) {
    redraw.clear();  // superseded by the text after it, which is cut now
    cutOverlong(output, after, lines);
  }
  line = redraw + '\r' + after;
  return redraw;
}

void OutputRelay::cutOverlong(RankOutput& output, std::string& text, Lines& lines) {
  if (text.size() <= kMaxLineBytes) return;
  const size_t cut = (text.size() - 1) / kMaxLineBytes * kMaxLineBytes;  // leaves 1..kMaxLineBytes
  addLine(output, std::string_view(text).substr(0, cut), lines);
  text.erase(0, cut);
}

void OutputRelay::writeOut(const Source& source, RankOutput& output, const Lines& lines,
                           const std::string& redraw) {
  const int stream = source.toStderr ? 1 : 0;
  const int fd = source.toStderr ? options_.stderrFd : options_.stdoutFd;
  std::string console = lines.console;
  // Lines on a terminal first erase a bar drawn there (on either stream: both may be one terminal);
  // a file or pipe never sees an escape sequence.
  if (terminal_[stream] && !console.empty()) eraseRedraw();
  if (options_.console && !output.hidden && terminal_[stream] && !redraw.empty()) {
    const std::string drawn =
        "\r" + output.prefix + std::string(withoutTorchPrefix(redraw, output.torchPrefix)) + "\033[K";
    if (redrawStream_ != stream || drawn != redrawShown_) {
      if (redrawStream_ != stream) eraseRedraw();
      console += drawn;
      redrawStream_ = stream;
      redrawShown_ = drawn;
    }
  }
  if (!console.empty()) writeAll(fd, broken_[stream], console);
  if (!lines.raw.empty() && !output.logBroken) {
    if (const int error = writeAll(output.logFd, output.logBroken, lines.raw); error != 0) {
      // Once per rank: the job runs on (the workers must never block on their output), the log not.
      const std::string line = "ddp-launch: cannot write rank " + std::to_string(source.rank) + "'s log file (" +
                               std::strerror(error) + "): the rest of its output is not in --log_dir; free space there\n";
      writeAll(options_.stderrFd, broken_[1], line);
    }
  }
}

void OutputRelay::eraseRedraw() {
  if (redrawStream_ < 0) return;
  const int fd = redrawStream_ == 1 ? options_.stderrFd : options_.stdoutFd;
  writeAll(fd, broken_[redrawStream_], std::string(kEraseLine));
  redrawStream_ = -1;
  redrawShown_.clear();
}

int OutputRelay::writeAll(int fd, bool& broken, const std::string& text) {
  size_t written = 0;
  while (!broken && written < text.size()) {
    const ssize_t count = ::write(fd, text.data() + written, text.size() - written);
    if (count >= 0) {
      written += static_cast<size_t>(count);
    } else if (abandonConsole_ && (fd == options_.stdoutFd || fd == options_.stderrFd)) {
      broken = true;  // finish()'s consoleLimit passed: the console's rest is dropped
    } else if (errno == EAGAIN) {
      pollfd writable{fd, POLLOUT, 0};  // the launcher's stdout may be non-blocking
      ::poll(&writable, 1, 100);        // and look at abandonConsole_ now and then
    } else if (errno != EINTR) {
      // EPIPE, ENOSPC and the like: keep draining the workers so they never block, drop the text.
      broken = true;
      return errno;
    }
  }
  return 0;
}

void OutputRelay::close(Source& source) {
  if (source.fd < 0) return;
  emitLines(source, true);
  ::close(source.fd);
  source.fd = -1;
}

}  // namespace ddp::launcher
