// One job per directory (common/dir_lock.h): the lock file names its holder, another process is
// refused with that pid, the holder's second call succeeds, and a holder that ends normally
// removes the file, while one that is killed leaves a file the next job takes over. Other
// processes are real ones (fork), reporting through a pipe.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/dir_lock.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
constexpr const char* kLock = ".test.lock";

// What lockDirectory(dir) gives in a child process: "held", or "refused <pid>". The child ends
// as `ending` says: "exit" (normally, its locks removed), "kill" (SIGKILL, nothing cleaned up) or
// "_exit" (no exit handlers).
std::string lockInAChild(const std::string& dir, const std::string& ending) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    const DirLock lock = lockDirectory(dir, kLock);
    const std::string said = lock.held ? "held" : "refused " + lock.holder;
    (void)::write(fds[1], said.data(), said.size());
    ::close(fds[1]);
    if (ending == "kill") ::raise(SIGKILL);
    if (ending == "exit") std::exit(0);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string said;
  char buffer[64];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) said.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return said;
}

std::string fileText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(DirLock, AnotherProcessIsRefusedWithTheHoldersPidAndTheHolderMayCallAgain) {
  const std::string dir = test::makeTempDir("dir_lock");
  ASSERT_TRUE(lockDirectory(dir, kLock).held);
  const std::string text = fileText(dir + "/" + kLock);
  EXPECT_EQ(text.substr(0, text.find('\n')), std::to_string(::getpid())) << text;
  EXPECT_TRUE(lockDirectory(dir, kLock).held);  // this process's second call
  EXPECT_EQ(lockInAChild(dir, "_exit"), "refused " + std::to_string(::getpid()));
  EXPECT_EQ(dirLockRefusal(DirLock{false, "4242", 0}, dir, kLock, "output.dir"),
            " is in use by another job (pid 4242 holds " + dir + "/" + kLock + "); give each job its own output.dir");
  releaseDirectoryLocks();
  EXPECT_FALSE(fs::exists(dir + "/" + kLock));  // released and removed
  EXPECT_EQ(lockInAChild(dir, "_exit"), "held");
  fs::remove_all(dir);
}

// A process that exits normally leaves no lock file; one killed leaves its file, with its pid,
// and the next job takes it (the kernel dropped the lock with the process).
TEST(DirLock, ANormalExitRemovesTheFileAKilledHoldersFileIsTakenOver) {
  const std::string dir = test::makeTempDir("dir_lock");
  EXPECT_EQ(lockInAChild(dir, "exit"), "held");
  EXPECT_FALSE(fs::exists(dir + "/" + kLock));
  EXPECT_EQ(lockInAChild(dir, "kill"), "held");
  EXPECT_TRUE(fs::exists(dir + "/" + kLock));
  ASSERT_TRUE(lockDirectory(dir, kLock).held);
  const std::string text = fileText(dir + "/" + kLock);
  EXPECT_EQ(text.substr(0, text.find('\n')), std::to_string(::getpid())) << "the file names its new holder";
  releaseDirectoryLocks();
  fs::remove_all(dir);
}

// A holder removes the file before it unlocks: a process that opened the old file and locks it
// afterwards must see that it holds a file no longer at the path (and take the new one).
TEST(DirLock, AFileNoLongerAtItsPathIsNotTheLock) {
  const std::string dir = test::makeTempDir("dir_lock");
  const std::string path = dir + "/" + kLock;
  std::ofstream(path) << "1\n";
  const int old = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(old, 0);
  EXPECT_TRUE(detail::isTheFileAt(old, path));
  fs::remove(path);
  EXPECT_FALSE(detail::isTheFileAt(old, path));
  std::ofstream(path) << "2\n";
  EXPECT_FALSE(detail::isTheFileAt(old, path));
  ::close(old);
  fs::remove_all(dir);
}

// Two processes of one pid number in two containers sharing a volume are told apart by the boot
// id and the start time after the pid.
TEST(DirLock, TheIdentityIsMoreThanThePid) {
  const std::string id = detail::processIdentity();
  EXPECT_EQ(id.substr(0, id.find('\n')), std::to_string(::getpid()));
  const std::string rest = id.substr(id.find('\n') + 1);
  EXPECT_GT(rest.size(), std::string(" \n").size()) << "no boot id or start time: " << id;
  EXPECT_EQ(detail::processIdentity(), id);
}

}  // namespace
}  // namespace ddp
