#include "tests/launcher/launched_process.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/launcher/scratch_dir.h"

extern char** environ;  // NOLINT: POSIX

namespace ddp::launcher::testing {
namespace {

std::vector<std::string> mergedEnvironment(const std::map<std::string, std::optional<std::string>>& changes) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    if (changes.count(text.substr(0, text.find('='))) == 0) env.push_back(text);
  }
  for (const auto& [name, value] : changes) {
    if (value) env.push_back(name + "=" + *value);
  }
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (std::string& text : strings) result.push_back(text.data());
  result.push_back(nullptr);
  return result;
}

}  // namespace

LaunchedProcess::LaunchedProcess(const LaunchSpec& spec)
    : stdoutPath_(spec.outputDir + "/" + spec.name + ".out"), stderrPath_(spec.outputDir + "/" + spec.name + ".err") {
  std::vector<std::string> argv{DDP_LAUNCH_BIN};
  argv.insert(argv.end(), spec.args.begin(), spec.args.end());
  std::vector<std::string> env = mergedEnvironment(spec.env);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (spec.stdoutFd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, spec.stdoutFd, STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, stdoutPath_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderrPath_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  // gtest or ctest may run us with signals blocked or ignored; the launcher must see a
  // shell's defaults, or it would (rightly) leave an ignored SIGINT ignored.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  const int status = ::posix_spawn(&pid_, argv[0].c_str(), &actions, &attributes, pointers(argv).data(),
                                   pointers(env).data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (status != 0) throw std::runtime_error(std::string("posix_spawn ddp-launch: ") + std::strerror(status));
}

LaunchedProcess::~LaunchedProcess() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    waitFor(std::chrono::seconds(10));
  }
}

std::optional<int> LaunchedProcess::waitFor(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    int status = 0;
    const pid_t result = ::waitpid(pid_, &status, WNOHANG);
    if (result == pid_) {
      reaped_ = true;
      code_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      break;
    }
    if (result < 0 && errno != EINTR) throw std::runtime_error("waitpid ddp-launch failed");
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return code_;
}

void LaunchedProcess::sendSignal(int signal) const {
  if (!reaped_) ::kill(pid_, signal);
}

std::string LaunchedProcess::stdoutText() const { return readFile(stdoutPath_); }
std::string LaunchedProcess::stderrText() const { return readFile(stderrPath_); }

bool LaunchedProcess::waitForStderr(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (stderrText().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline || waitFor(std::chrono::milliseconds(5))) return false;
  }
  return true;
}

LaunchResult runLauncher(const LaunchSpec& spec, std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  LaunchResult result;
  {
    LaunchedProcess process(spec);
    result.code = process.waitFor(timeout);
    result.elapsed = std::chrono::steady_clock::now() - start;
  }
  // Read after the destructor, so output is complete even when the run timed out.
  result.out = readFile(spec.outputDir + "/" + spec.name + ".out");
  result.err = readFile(spec.outputDir + "/" + spec.name + ".err");
  return result;
}

}  // namespace ddp::launcher::testing
