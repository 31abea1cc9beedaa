// Unit tests of the rank-prefixing output relay, fed through real pipes.
#include "launcher/output_relay.h"

#include <algorithm>
#include <csignal>
#include <regex>
#include <thread>

#include <fcntl.h>
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

// A worker's progress bar ends in '\r' (worker/report/progress.h): the console gets it drawn in place
// ("\r[rank 0] text" + erase to the end of the line), only the latest of a burst, erased before
// the next line; log files and the failure summary's tail never see it.
TEST_F(OutputRelayTest, ProgressBarsAreDrawnInPlaceAndNeverLogged) {
  const std::string logPath = dir_.file("rank0.log");
  Pipe out0;
  relay_.add(out0.read, 0, false);
  relay_.addLogFile(0, ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  // Written before start(): the relay reads it as one chunk, so the expected bytes are exact.
  writeText(out0.write, "line1\n[##..] 1/4\r[###.] 2/4\rline2\n[####] 4/4\r");
  ::close(out0.write);
  relay_.start();
  relay_.finish();
  EXPECT_EQ(out(), "[rank 0] line1\n[rank 0] line2\n\r[rank 0] [####] 4/4\033[K\r\033[K");
  EXPECT_EQ(readFile(logPath), "line1\nline2\n");
  EXPECT_EQ(relay_.lastLines(0), (std::vector<std::string>{"line1", "line2"}));
}

TEST_F(OutputRelayTest, ALineAfterABarErasesItFirst) {
  Pipe out0;
  Pipe err1;
  relay_.add(out0.read, 0, false);
  relay_.add(err1.read, 1, true);
  writeText(out0.write, "[#...] 1/4\r");
  relay_.start();
  // The bar reaches the console before rank 1's line is written.
  for (int i = 0; i < 500 && out().find("1/4") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(out(), "\r[rank 0] [#...] 1/4\033[K");
  writeText(err1.write, "rank 1 says\n");
  ::close(out0.write);
  ::close(err1.write);
  relay_.finish();
  EXPECT_EQ(err(), "\r\033[K[rank 1] rank 1 says\n");
  EXPECT_EQ(out(), "\r[rank 0] [#...] 1/4\033[K");  // erased through stderr: the same terminal
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
