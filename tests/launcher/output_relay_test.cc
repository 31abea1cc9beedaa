// Unit tests of the rank-prefixing output relay, fed through real pipes.
#include "launcher/output_relay.h"

#include <algorithm>
#include <cstdlib>
#include <csignal>
#include <regex>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher {
namespace {

using testing::readFile;
using testing::ScratchDir;
using testing::splitLines;

struct Pipe {
  int read = -1;
  int write = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    read = fds[0];
    write = fds[1];
  }
};

void writeText(int fd, const std::string& text) { ASSERT_EQ(::write(fd, text.data(), text.size()), ssize_t(text.size())); }

// Relays into two files, so a full pipe can never stall the relay under test.
class OutputRelayTest : public ::testing::Test {
 protected:
  OutputRelayTest()
      : outFd_(::open(dir_.file("out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)),
        errFd_(::open(dir_.file("err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)),
        relay_(outFd_, errFd_) {}
  ~OutputRelayTest() override {
    relay_.finish();
    ::close(outFd_);
    ::close(errFd_);
  }
  std::string out() { return readFile(dir_.file("out")); }
  std::string err() { return readFile(dir_.file("err")); }

  ScratchDir dir_;
  int outFd_;
  int errFd_;
  OutputRelay relay_;
};

TEST_F(OutputRelayTest, PrefixesEveryLineAndKeepsStreamsApart) {
  Pipe out3;
  Pipe err3;
  relay_.add(out3.read, 3, false);
  relay_.add(err3.read, 3, true);
  relay_.start();
  writeText(out3.write, "hello\nwor");
  writeText(out3.write, "ld\n\nlast without newline");
  writeText(err3.write, "warning\n");
  ::close(out3.write);
  ::close(err3.write);
  relay_.finish();
  EXPECT_EQ(out(), "[rank 3] hello\n[rank 3] world\n[rank 3] \n[rank 3] last without newline\n");
  EXPECT_EQ(err(), "[rank 3] warning\n");
}

TEST_F(OutputRelayTest, FinishDrainsPipesWhoseWriterIsStillOpen) {
  // A worker's orphaned child may hold the pipe open forever; finish() must not wait for EOF.
  Pipe out0;
  relay_.add(out0.read, 0, false);
  relay_.start();
  writeText(out0.write, "before finish\npartial");
  relay_.finish();
  ::close(out0.write);
  EXPECT_EQ(out(), "[rank 0] before finish\n[rank 0] partial\n");
}

TEST_F(OutputRelayTest, OverlongLinesAreCut) {
  Pipe out1;
  relay_.add(out1.read, 1, false);
  relay_.start();
  std::thread writer([&] {
    writeText(out1.write, std::string(OutputRelay::kMaxLineBytes + 10, 'x') + "\n");
    ::close(out1.write);
  });
  writer.join();
  relay_.finish();
  EXPECT_EQ(out(), "[rank 1] " + std::string(OutputRelay::kMaxLineBytes, 'x') + "\n[rank 1] xxxxxxxxxx\n");
}

TEST_F(OutputRelayTest, LinesFromConcurrentRanksNeverMix) {
  constexpr int kRanks = 4;
  constexpr int kLines = 2000;
  std::vector<Pipe> pipes(kRanks);
  for (int rank = 0; rank < kRanks; ++rank) relay_.add(pipes[rank].read, rank, false);
  relay_.start();
  std::vector<std::thread> writers;
  for (int rank = 0; rank < kRanks; ++rank) {
    writers.emplace_back([&, rank] {
      // Odd-sized writes split lines across reads, so the relay must reassemble them.
      std::string text;
      for (int i = 0; i < kLines; ++i) text += "line " + std::to_string(rank) + " " + std::to_string(i) + "\n";
      for (size_t at = 0; at < text.size(); at += 7) writeText(pipes[rank].write, text.substr(at, 7));
      ::close(pipes[rank].write);
    });
  }
  for (std::thread& writer : writers) writer.join();
  relay_.finish();

  const std::regex pattern(R"(\[rank (\d)\] line (\d) (\d+))");
  std::vector<int> next(kRanks, 0);
  for (const std::string& line : splitLines(out())) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, pattern)) << "mangled line: " << line;
    const int rank = std::stoi(match[1]);
    ASSERT_EQ(std::stoi(match[2]), rank) << line;
    ASSERT_EQ(std::stoi(match[3]), next[rank]++) << line;
  }
  EXPECT_EQ(next, std::vector<int>(kRanks, kLines));
}

TEST_F(OutputRelayTest, ClosedDestinationDoesNotBlockTheWorkers) {
  // As ddp-launch's main() does, so writing to a closed pipe is EPIPE, not death.
  struct sigaction ignore {};
  struct sigaction previous {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &previous);
  Pipe sink;
  OutputRelay relay(sink.write, errFd_);
  ::close(sink.read);
  Pipe out2;
  relay.add(out2.read, 2, false);
  relay.start();
  // More than a pipe holds (a full write only returns if the relay keeps reading), then a last line.
  writeText(out2.write, std::string(1 << 20, 'y') + "\nthe end\n");
  ::close(out2.write);
  relay.finish();
  ::close(sink.write);
  ::sigaction(SIGPIPE, &previous, nullptr);
  // Every line was still read and processed although no write to the destination succeeded.
  const auto tail = relay.lastLines(2);
  ASSERT_FALSE(tail.empty());
  EXPECT_EQ(tail.back(), "the end");
}

}  // namespace
}  // namespace ddp::launcher

namespace ddp::launcher {
namespace {

TEST_F(OutputRelayTest, KeepsTheLastLinesOfEachRankForTheSummary) {
  Pipe out0;
  Pipe err0;
  Pipe out1;
  relay_.add(out0.read, 0, false);
  relay_.add(err0.read, 0, true);
  relay_.add(out1.read, 1, false);
  relay_.start();
  for (int i = 1; i <= 8; ++i) writeText(out0.write, "line " + std::to_string(i) + "\n");
  ::close(out0.write);
  ::close(err0.write);
  writeText(out1.write, std::string(OutputRelay::kMaxTailLineBytes + 50, 'z') + "\nno newline");
  ::close(out1.write);
  relay_.finish();
  // Default tailLines is 5: lines 4..8.
  EXPECT_EQ(relay_.lastLines(0), (std::vector<std::string>{"line 4", "line 5", "line 6", "line 7", "line 8"}));
  EXPECT_EQ(relay_.lastLines(1),
            (std::vector<std::string>{std::string(OutputRelay::kMaxTailLineBytes, 'z'), "no newline"}));
  EXPECT_TRUE(relay_.lastLines(7).empty());
}

// A rank killed by an uncaught exception prints std::terminate's two lines, then (LibTorch's
// c10::Error) a backtrace longer than the tail: the summary keeps the line that says why.
TEST_F(OutputRelayTest, TheMessageOfAnUncaughtExceptionStaysAboveItsBacktrace) {
  Pipe err0;
  Pipe err1;
  relay_.add(err0.read, 0, true);
  relay_.add(err1.read, 1, true);
  relay_.start();
  writeText(err0.write, "step 3\nterminate called after throwing an instance of 'c10::Error'\n"
                        "  what():  DefaultCPUAllocator: can't allocate memory: you tried to allocate 16777216 bytes\n");
  for (int i = 0; i < 12; ++i) writeText(err0.write, "frame #" + std::to_string(i) + ": 0x7f00 in libtorch_cpu.so\n");
  ::close(err0.write);
  writeText(err1.write, "  what():  short\nframe #0\n");  // in the tail already: nothing moves
  ::close(err1.write);
  relay_.finish();
  EXPECT_EQ(relay_.lastLines(0),
            (std::vector<std::string>{
                "  what():  DefaultCPUAllocator: can't allocate memory: you tried to allocate 16777216 bytes",
                "frame #8: 0x7f00 in libtorch_cpu.so", "frame #9: 0x7f00 in libtorch_cpu.so",
                "frame #10: 0x7f00 in libtorch_cpu.so", "frame #11: 0x7f00 in libtorch_cpu.so"}));
  EXPECT_EQ(relay_.lastLines(1), (std::vector<std::string>{"  what():  short", "frame #0"}));
}

// A relay whose stdout and stderr count as terminals (as isatty() would say), writing to files.
OutputRelayOptions terminalOptions(int outFd, int errFd, bool stderrIsTerminal = true) {
  OutputRelayOptions options;
  options.stdoutFd = outFd;
  options.stderrFd = errFd;
  options.stdoutIsTerminal = true;
  options.stderrIsTerminal = stderrIsTerminal;
  return options;
}

// A worker's progress bar ends in '\r' (worker/report/progress.h): a terminal gets it drawn in place
// ("\r[rank 0] text" + erase to the end of the line), only the latest of a burst, erased before
// the next line; log files and the failure summary's tail never see it.
TEST_F(OutputRelayTest, ProgressBarsAreDrawnInPlaceOnATerminalAndNeverLogged) {
  const std::string logPath = dir_.file("rank0.log");
  OutputRelay relay(terminalOptions(outFd_, errFd_));
  Pipe out0;
  relay.add(out0.read, 0, false);
  relay.addLogFile(0, ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  // Written before start(): the relay reads it as one chunk, so the expected bytes are exact.
  writeText(out0.write, "line1\n[##..] 1/4\r[###.] 2/4\rline2\n[####] 4/4\r");
  ::close(out0.write);
  relay.start();
  relay.finish();
  EXPECT_EQ(out(), "[rank 0] line1\n[rank 0] line2\n\r[rank 0] [####] 4/4\033[K\r\033[K");
  EXPECT_EQ(readFile(logPath), "line1\nline2\n");
  EXPECT_EQ(relay.lastLines(0), (std::vector<std::string>{"line1", "line2"}));
}

// A rank's log file that cannot be written (--log_dir on a full disk: /dev/full here) is said once on
// the launcher's stderr; the console goes on (a fault-injection review: the job exited 0, the logs
// cut at 8 KiB, and nothing said so).
TEST_F(OutputRelayTest, ALogFileThatCannotBeWrittenIsSaidOnce) {
  OutputRelay relay(terminalOptions(outFd_, errFd_, /*stderrIsTerminal=*/false));
  Pipe out0;
  relay.add(out0.read, 0, false);
  relay.addLogFile(0, ::open("/dev/full", O_WRONLY | O_CLOEXEC));
  writeText(out0.write, "line1\nline2\n");
  relay.start();
  writeText(out0.write, "line3\n");
  ::close(out0.write);
  relay.finish();
  EXPECT_NE(out().find("[rank 0] line3\n"), std::string::npos) << out();
  const std::string said = "ddp-launch: cannot write rank 0's log file (No space left on device)";
  const std::string errors = err();
  ASSERT_NE(errors.find(said), std::string::npos) << errors;
  EXPECT_EQ(errors.find(said, errors.find(said) + 1), std::string::npos) << "said once:\n" << errors;
}

// A redraw that a newline in the same read already finished is stale: the terminal gets the
// finished line only, not the old redraw drawn below it.
TEST_F(OutputRelayTest, ATerminalNeverGetsARedrawOlderThanTheLineThatEndedIt) {
  OutputRelay relay(terminalOptions(outFd_, errFd_));
  Pipe out0;
  relay.add(out0.read, 0, false);
  writeText(out0.write, "\rstep 1/2\rstep 2/2\ndone\n");
  ::close(out0.write);
  relay.start();
  relay.finish();
  EXPECT_EQ(out(), "[rank 0] step 2/2\n[rank 0] done\n");
}

TEST_F(OutputRelayTest, ALineAfterABarErasesItFirst) {
  OutputRelay relay(terminalOptions(outFd_, errFd_));
  Pipe out0;
  Pipe err1;
  relay.add(out0.read, 0, false);
  relay.add(err1.read, 1, true);
  writeText(out0.write, "[#...] 1/4\r");
  relay.start();
  // The bar reaches the console before rank 1's line is written.
  for (int i = 0; i < 500 && out().find("1/4") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(out(), "\r[rank 0] [#...] 1/4\033[K");
  writeText(err1.write, "rank 1 says\n");
  ::close(out0.write);
  ::close(err1.write);
  relay.finish();
  // Erased where it was drawn (stdout), then the line goes to stderr: the same terminal.
  EXPECT_EQ(out(), "\r[rank 0] [#...] 1/4\033[K\r\033[K");
  EXPECT_EQ(err(), "[rank 1] rank 1 says\n");
}

// stdout a terminal, stderr redirected to a file (`2>err.log`): the file gets no escape sequence
// although a bar is drawn on the terminal.
TEST_F(OutputRelayTest, AStreamThatIsNoTerminalNeverGetsEscapes) {
  OutputRelay relay(terminalOptions(outFd_, errFd_, /*stderrIsTerminal=*/false));
  Pipe out0;
  Pipe err0;
  relay.add(out0.read, 0, false);
  relay.add(err0.read, 0, true);
  writeText(out0.write, "[#...] 1/4\r");
  writeText(err0.write, "a\rb\rwarning\r\nlast\r");
  ::close(out0.write);
  ::close(err0.write);
  relay.start();
  relay.finish();
  EXPECT_EQ(err(), "[rank 0] warning\n");
  EXPECT_EQ(out(), "\r[rank 0] [#...] 1/4\033[K\r\033[K");
}

// Files and pipes (what the fixture's relay writes to, found by isatty()) and log files get
// clean lines: each line is the text after its last '\r' (earlier redraws are gone), "\r\n" is
// a plain line end, and never an escape sequence.
TEST_F(OutputRelayTest, FilesAndPipesGetOnlyTheFinalStateOfARedrawnLine) {
  const std::string logPath = dir_.file("rank0.log");
  Pipe out0;
  relay_.add(out0.read, 0, false);
  relay_.addLogFile(0, ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  writeText(out0.write,
            "\rTrain 1/3 loss 2.3\rTrain 2/3 loss 1.1\rTrain 3/3 loss 0.5\nTest: 91%\r\n"
            "[##..] 1/2\r[####] 2/2\r\n[#...]\rwindows\r\n");
  ::close(out0.write);
  relay_.start();
  relay_.finish();
  EXPECT_EQ(out(), "[rank 0] Train 3/3 loss 0.5\n[rank 0] Test: 91%\n[rank 0] [####] 2/2\n[rank 0] windows\n");
  EXPECT_EQ(readFile(logPath), "Train 3/3 loss 0.5\nTest: 91%\n[####] 2/2\nwindows\n");
  EXPECT_EQ(relay_.lastLines(0),
            (std::vector<std::string>{"Train 3/3 loss 0.5", "Test: 91%", "[####] 2/2", "windows"}));
}

// The same bytes one at a time: a "\r\n" split over two reads is still a plain line end, and
// a redraw split anywhere still ends as its final state.
TEST_F(OutputRelayTest, RedrawsSplitOverManyReadsEndTheSame) {
  Pipe out0;
  relay_.add(out0.read, 0, false);
  relay_.start();
  for (const char byte : std::string("\rstep 1\rstep 2\r\nok\r\nbar 1\rbar 2\rdone\n")) {
    writeText(out0.write, std::string(1, byte));
  }
  ::close(out0.write);
  relay_.finish();
  EXPECT_EQ(out(), "[rank 0] step 2\n[rank 0] ok\n[rank 0] done\n");
}

// A worker that exits in the middle of redrawing (mnist's printf("\r...") with no final '\n')
// leaves its last text as a line; one whose line ends in '\r' (a bar waiting to be redrawn,
// which a terminal erases) leaves nothing.
TEST_F(OutputRelayTest, ARedrawUnfinishedAtExitLeavesItsFinalTextAsALine) {
  const std::string logPath = dir_.file("rank2.log");
  Pipe out2;
  Pipe err2;
  relay_.add(out2.read, 2, false);
  relay_.add(err2.read, 2, true);
  relay_.addLogFile(2, ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  writeText(out2.write, "\rTrain 1/9\rTrain 2/9");
  writeText(err2.write, "[#.] 1/2\r");
  ::close(out2.write);
  ::close(err2.write);
  relay_.start();
  relay_.finish();
  EXPECT_EQ(out(), "[rank 2] Train 2/9\n");
  EXPECT_EQ(err(), "");
  EXPECT_EQ(readFile(logPath), "Train 2/9\n");
  EXPECT_EQ(relay_.lastLines(2), std::vector<std::string>{"Train 2/9"});
}

// PyTorch prefixes its own log lines with the rank: c10's logging "[rank1]:[W127 ...] text",
// torch._logging "[rank1]:W0127 ...", torch.distributed's excepthook "[rank1]: Traceback".
// The console shows one prefix, ours; another rank's (or another number's) prefix is kept; the
// log file keeps the lines as written.
TEST_F(OutputRelayTest, PyTorchsOwnPrefixOfTheSameRankIsDropped) {
  const std::string logPath = dir_.file("rank1.log");
  Pipe err1;
  relay_.add(err1.read, 1, true);
  relay_.addLogFile(1, ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  const std::string written =
      "[rank1]:[W127 10:11:12.123456789 ProcessGroupGloo.cpp:42] Warning: slow\n"
      "[rank1]:W0127 10:11:12.123000 4242 torch/distributed/x.py:7] python warning\n"
      "[rank1]: Traceback (most recent call last):\n"
      "[rank0]: x\n"
      "[rank12]: y\n"
      "[rank1] z\n";
  writeText(err1.write, written);
  ::close(err1.write);
  relay_.start();
  relay_.finish();
  EXPECT_EQ(err(),
            "[rank 1] [W127 10:11:12.123456789 ProcessGroupGloo.cpp:42] Warning: slow\n"
            "[rank 1] W0127 10:11:12.123000 4242 torch/distributed/x.py:7] python warning\n"
            "[rank 1] Traceback (most recent call last):\n"
            "[rank 1] [rank0]: x\n"
            "[rank 1] [rank12]: y\n"
            "[rank 1] [rank1] z\n");
  EXPECT_EQ(readFile(logPath), written);
}

// Reads from `fd` until `size` bytes came or nothing more comes for 5 s.
std::string readAtLeast(int fd, size_t size) {
  std::string text;
  char buffer[4096];
  pollfd readable{fd, POLLIN, 0};
  while (text.size() < size && ::poll(&readable, 1, 5000) == 1) {
    const ssize_t count = ::read(fd, buffer, sizeof(buffer));
    if (count <= 0) break;
    text.append(buffer, static_cast<size_t>(count));
  }
  return text;
}

// Without stdoutIsTerminal/stderrIsTerminal the relay asks isatty(): a pseudo-terminal gets the bar
// drawn in place, a file next to it gets the finished line only.
TEST_F(OutputRelayTest, ATerminalIsFoundByIsatty) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) GTEST_SKIP() << "no pseudo-terminal here";
  const int terminal = ::open(::ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(terminal, 0);
  termios raw{};
  ASSERT_EQ(::tcgetattr(terminal, &raw), 0);
  ::cfmakeraw(&raw);  // bytes as written: no "\n" -> "\r\n"
  ASSERT_EQ(::tcsetattr(terminal, TCSANOW, &raw), 0);
  {
    OutputRelay relay(terminal, errFd_);
    Pipe out0;
    Pipe err0;
    relay.add(out0.read, 0, false);
    relay.add(err0.read, 0, true);
    writeText(out0.write, "[#.] 1/2\r");
    writeText(err0.write, "a\rb\n");
    ::close(out0.write);
    ::close(err0.write);
    relay.start();
    relay.finish();
  }
  const std::string expected = "\r[rank 0] [#.] 1/2\033[K\r\033[K";
  EXPECT_EQ(readAtLeast(master, expected.size()), expected);
  EXPECT_EQ(err(), "[rank 0] b\n");
  ::close(terminal);
  ::close(master);
}

TEST_F(OutputRelayTest, LogFilesGetRawLinesAndTheConsoleOnlyWhenAsked) {
  for (const bool console : {false, true}) {
    SCOPED_TRACE(console ? "tee" : "log only");
    const std::string outPath = dir_.file(console ? "tee.out" : "plain.out");
    const std::string logPath = dir_.file(console ? "tee.log" : "plain.log");
    const int outFd = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    OutputRelayOptions options;
    options.stdoutFd = outFd;
    options.stderrFd = outFd;
    options.console = console;
    {
      OutputRelay relay(options);
      Pipe out4;
      Pipe err4;
      relay.add(out4.read, 4, false);
      relay.add(err4.read, 4, true);
      relay.addLogFile(4, ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      relay.start();
      writeText(out4.write, "first\n");
      writeText(err4.write, "warn");
      ::close(out4.write);
      ::close(err4.write);
      relay.finish();
    }
    ::close(outFd);
    // stdout and stderr are separate pipes, so their relative order is not fixed.
    std::vector<std::string> logged = splitLines(readFile(logPath));
    std::sort(logged.begin(), logged.end());
    EXPECT_EQ(logged, (std::vector<std::string>{"first", "warn"}));
    std::vector<std::string> shown = splitLines(readFile(outPath));
    std::sort(shown.begin(), shown.end());
    EXPECT_EQ(shown, console ? (std::vector<std::string>{"[rank 4] first", "[rank 4] warn"})
                             : std::vector<std::string>{});
  }
}

}  // namespace
}  // namespace ddp::launcher
