// Unit tests of exit-status decoding and the wording of failures.
#include "launcher/exit_status.h"

#include <csignal>

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace ddp::launcher {
namespace {

// The real status word of a child that did `action`.
int statusOf(void (*action)()) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    action();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(ExitStatus, DecodesRealExitsAndSignals) {
  const ExitStatus exited = ExitStatus::fromWaitStatus(statusOf([] { ::_exit(3); }));
  EXPECT_FALSE(exited.signaled);
  EXPECT_EQ(exited.code, 3);
  EXPECT_EQ(exited.shellCode(), 3);
  EXPECT_EQ(exited.describe(), "exit code 3");
  EXPECT_FALSE(exited.success());

  const ExitStatus killed = ExitStatus::fromWaitStatus(statusOf([] { ::kill(::getpid(), SIGUSR1); }));
  EXPECT_TRUE(killed.signaled);
  EXPECT_EQ(killed.signal, SIGUSR1);
  EXPECT_EQ(killed.shellCode(), 128 + SIGUSR1);
  EXPECT_EQ(killed.describe(), "SIGUSR1");

  EXPECT_TRUE(ExitStatus::fromWaitStatus(statusOf([] {})).success());
}

TEST(ExitStatus, CoreDumpIsMentioned) {
  ExitStatus status = ExitStatus::killedBy(SIGSEGV);
  status.coreDumped = true;
  EXPECT_EQ(status.describe(), "SIGSEGV (core dumped)");
  EXPECT_EQ(status.shellCode(), 128 + 11);
}

TEST(ExitStatus, SignalNames) {
  EXPECT_EQ(signalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(signalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(signalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(signalName(SIGINT), "SIGINT");
  EXPECT_EQ(signalName(SIGHUP), "SIGHUP");
  EXPECT_EQ(signalName(SIGRTMIN + 2), "SIGRTMIN+2");
  EXPECT_EQ(signalName(0), "signal 0");
}

}  // namespace
}  // namespace ddp::launcher
