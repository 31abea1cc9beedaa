#include "launcher/output_relay.h"

#include <algorithm>
#include <cerrno>
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

}  // namespace

OutputRelay::OutputRelay(int stdoutFd, int stderrFd) : OutputRelay(consoleOptions(stdoutFd, stderrFd)) {}

OutputRelay::OutputRelay(const OutputRelayOptions& options) : options_(options) {
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
  if (statusShown_) {
    writeAll(options_.stdoutFd, broken_[0], "\r\033[K");  // the launcher's own lines start clean
    statusShown_ = false;
  }
  for (auto& [rank, output] : ranks_) {
    if (output.logFd >= 0) ::close(output.logFd);
    output.logFd = -1;
  }
}

std::vector<std::string> OutputRelay::lastLines(int rank) const {
  const auto found = ranks_.find(rank);
  if (found == ranks_.end()) return {};
  return std::vector<std::string>(found->second.tail.begin(), found->second.tail.end());
}

OutputRelay::RankOutput& OutputRelay::rankOutput(int rank) {
  RankOutput& output = ranks_[rank];
  if (output.prefix.empty()) output.prefix = "[rank " + std::to_string(rank) + "] ";
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

void OutputRelay::emitLines(Source& source, bool flushPartial) {
  RankOutput& output = ranks_.at(source.rank);
  std::string console;  // prefixed lines, when the console gets them
  std::string raw;      // unprefixed lines, when there is a log file
  const auto addLine = [&](size_t begin, size_t length) {
    if (options_.console) console.append(output.prefix).append(source.pending, begin, length).push_back('\n');
    if (output.logFd >= 0) raw.append(source.pending, begin, length).push_back('\n');
    output.tail.push_back(source.pending.substr(begin, std::min(length, kMaxTailLineBytes)));
    if (output.tail.size() > options_.tailLines) output.tail.pop_front();
  };
  std::string status;  // the last progress-bar text in this read, drawn in place on the console
  size_t begin = 0;
  while (true) {
    size_t newline = source.pending.find('\n', begin);
    // "text\r" not followed by '\n': a progress bar that redraws its line (worker/report/progress.h).
    const size_t carriage = source.pending.find('\r', begin);
    if (carriage != std::string::npos && carriage < newline && carriage + 1 < source.pending.size() &&
        source.pending[carriage + 1] != '\n') {
      if (carriage - begin <= kMaxLineBytes) status = source.pending.substr(begin, carriage - begin);
      begin = carriage + 1;
      continue;
    }
    if (carriage != std::string::npos && carriage + 1 == source.pending.size() && carriage < newline) {
      if (carriage - begin <= kMaxLineBytes) status = source.pending.substr(begin, carriage - begin);
      begin = carriage + 1;
      break;
    }
    if (newline != std::string::npos && newline - begin > kMaxLineBytes) newline = std::string::npos;
    if (newline == std::string::npos && source.pending.size() - begin >= kMaxLineBytes) {
      addLine(begin, kMaxLineBytes);  // cut, keeping the relay's memory bounded
      begin += kMaxLineBytes;
      continue;
    }
    if (newline == std::string::npos) break;
    addLine(begin, newline - begin);
    begin = newline + 1;
  }
  if (flushPartial && begin < source.pending.size()) {
    addLine(begin, source.pending.size() - begin);
    begin = source.pending.size();
  }
  source.pending.erase(0, begin);
  if (!options_.console) status.clear();
  if (!console.empty() && statusShown_) {
    console.insert(0, "\r\033[K");  // erase the bar; a later one is drawn below the lines
    statusShown_ = false;
  }
  if (!status.empty()) {
    console.append("\r").append(output.prefix).append(status).append("\033[K");
    statusShown_ = true;
  }
  if (!console.empty()) {
    writeAll(source.toStderr ? options_.stderrFd : options_.stdoutFd, broken_[source.toStderr ? 1 : 0], console);
  }
  if (!raw.empty()) writeAll(output.logFd, output.logBroken, raw);
}

void OutputRelay::writeAll(int fd, bool& broken, const std::string& text) {
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
    }
  }
}

void OutputRelay::close(Source& source) {
  if (source.fd < 0) return;
  emitLines(source, true);
  ::close(source.fd);
  source.fd = -1;
}

}  // namespace ddp::launcher
