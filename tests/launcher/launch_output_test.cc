// Runs the real ddp-launch with workers that redraw their lines with '\r' and print PyTorch's own
// rank prefix: what reaches a pipe, a file and the --log_dir files.
#include <algorithm>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/launcher/launched_process.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::seconds;

// mnist.cpp's way (printf("\r...") per step, '\n' at the end of an epoch), a "\r\n" line end, and
// a redraw still unfinished when the worker exits.
constexpr const char* kRedrawingWorker =
    "printf '\\rstep 1/3'\nprintf '\\rstep 2/3'\nprintf '\\rstep 3/3\\n'\n"
    "printf 'windows line\\r\\n'\n"
    "printf '\\rleft 1\\rleft 2'\n";

// The lines of `text` that rank `rank` wrote, without the "[rank N] " prefix, in their order.
std::vector<std::string> linesOfRank(const std::string& text, int rank) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  std::vector<std::string> lines;
  for (const std::string& line : splitLines(text)) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
  }
  return lines;
}

// Everything written to `fd` until its write ends are closed, or what came in `timeout`.
std::string readToEnd(int fd, std::chrono::milliseconds timeout) {
  std::string text;
  char buffer[4096];
  pollfd readable{fd, POLLIN, 0};
  while (::poll(&readable, 1, static_cast<int>(timeout.count())) == 1) {
    const ssize_t count = ::read(fd, buffer, sizeof(buffer));
    if (count <= 0) break;
    text.append(buffer, static_cast<size_t>(count));
  }
  return text;
}

class LaunchOutputTest : public ::testing::Test {
 protected:
  void SetUp() override { becomeSubreaper(); }

  LaunchResult run(std::vector<std::string> args) {
    LaunchSpec spec;
    spec.args = std::move(args);
    spec.outputDir = dir_.path();
    return runLauncher(spec);
  }

  ScratchDir dir_;
};

const std::vector<std::string> kFinalLines{"step 3/3", "windows line", "left 2"};

TEST_F(LaunchOutputTest, APipeGetsOnlyTheFinalStateOfRedrawnLines) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  LaunchSpec spec;
  spec.args = {"--nproc_per_node=2", dir_.writeScript("redraw", kRedrawingWorker)};
  spec.outputDir = dir_.path();
  spec.stdoutFd = fds[1];
  LaunchedProcess launcher(spec);
  ::close(fds[1]);
  const std::string out = readToEnd(fds[0], seconds(20));
  ::close(fds[0]);
  ASSERT_EQ(launcher.waitFor(seconds(20)), 0) << launcher.stderrText();
  EXPECT_EQ(out.find('\033'), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(linesOfRank(out, rank), kFinalLines) << out;
  EXPECT_EQ(splitLines(out).size(), 2 * kFinalLines.size()) << out;
}

TEST_F(LaunchOutputTest, LogFilesAndAFileConsoleGetOnlyTheFinalStateOfRedrawnLines) {
  const std::string logs = dir_.file("logs");
  const LaunchResult result =
      run({"--tee", "--nproc_per_node=2", "--log_dir=" + logs, dir_.writeScript("redraw", kRedrawingWorker)});
  ASSERT_EQ(result.code, 0) << result.err;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(readFile(logs + "/rank_" + std::to_string(rank) + ".log"), "step 3/3\nwindows line\nleft 2\n");
    EXPECT_EQ(linesOfRank(result.out, rank), kFinalLines) << result.out;
  }
  EXPECT_EQ(result.out.find('\033'), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find('\r'), std::string::npos) << result.out;
}

TEST_F(LaunchOutputTest, PyTorchsPrefixOfTheSameRankIsNotDoubled) {
  // c10's logging as a process group sets it up ("[rankN]:[W...] "), and another rank's prefix.
  const std::string script = dir_.writeScript(
      "torch_log", "echo \"[rank$RANK]:[W127 10:11:12.123456789 ProcessGroupGloo.cpp:42] slow on rank $RANK\" >&2\n"
                   "if [ \"$RANK\" = 1 ]; then echo '[rank0]: x' >&2; fi\n");
  const LaunchResult result = run({"--nproc_per_node=2", script});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(linesOfRank(result.err, 0),
            std::vector<std::string>{"[W127 10:11:12.123456789 ProcessGroupGloo.cpp:42] slow on rank 0"})
      << result.err;
  EXPECT_EQ(linesOfRank(result.err, 1),
            (std::vector<std::string>{"[W127 10:11:12.123456789 ProcessGroupGloo.cpp:42] slow on rank 1", "[rank0]: x"}))
      << result.err;
}

// Issue 45 (2): torchrun's --local_ranks_filter (pytorch#118562) and our --ranks_filter by global
// rank keep the other ranks off the console; their log files and the failure summary keep them.
TEST_F(LaunchOutputTest, RanksFiltersKeepTheOtherRanksOffTheConsoleOnly) {
  const std::string logs = dir_.file("logs");
  const std::string script = dir_.writeScript("hello", "echo \"hello from $RANK\"\n");
  for (const std::string& filter : {"--local_ranks_filter=1,2", "--ranks_filter=1,2"}) {
    SCOPED_TRACE(filter);
    const LaunchResult result = run({filter, "--nproc_per_node=3", "--tee", "--log_dir=" + logs, script});
    ASSERT_EQ(result.code, 0) << result.err;
    EXPECT_TRUE(linesOfRank(result.out, 0).empty()) << result.out;
    EXPECT_EQ(linesOfRank(result.out, 1), std::vector<std::string>{"hello from 1"}) << result.out;
    EXPECT_EQ(linesOfRank(result.out, 2), std::vector<std::string>{"hello from 2"}) << result.out;
    EXPECT_EQ(readFile(logs + "/rank_0.log"), "hello from 0\n");
  }
}

}  // namespace
}  // namespace ddp::launcher::testing
