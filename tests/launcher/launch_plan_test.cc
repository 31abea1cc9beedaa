// Unit tests of everything decided before a worker starts: program path, port, commands.
#include "launcher/launch_plan.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "common/error.h"
#include "launcher/free_port.h"
#include "launcher/worker_path.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher {
namespace {

using testing::ScratchDir;

std::string errorOf(const std::string& worker, const std::string& path) {
  try {
    resolveWorkerPath(worker, path);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(WorkerPath, PathsAreCheckedAndBareNamesSearchedOnPath) {
  ScratchDir dir;
  const std::string script = dir.writeScript("tool", "exit 0");
  EXPECT_EQ(resolveWorkerPath(script, ""), script);
  EXPECT_EQ(resolveWorkerPath("tool", "/nonexistent:" + dir.path()), dir.path() + "/tool");
  EXPECT_EQ(resolveWorkerPath("sh", "/bin:/usr/bin").substr(0, 1), "/");

  EXPECT_NE(errorOf(dir.file("missing"), "").find("not found"), std::string::npos);
  EXPECT_NE(errorOf("missing-tool", dir.path()).find("'missing-tool' not found on PATH"), std::string::npos);
  EXPECT_NE(errorOf(dir.path(), "").find("is a directory"), std::string::npos);
  const std::string plain = dir.file("plain");
  ::close(::creat(plain.c_str(), 0644));
  EXPECT_NE(errorOf(plain, "").find("is not executable; chmod +x it"), std::string::npos);
  EXPECT_NE(errorOf("plain", dir.path()).find("not executable"), std::string::npos);
}

// Whether a listener without SO_REUSEADDR can take `port` on 127.0.0.1 right now.
bool canListenOn(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 && ::listen(fd, 1) == 0;
  ::close(fd);
  return ok;
}

TEST(FreePort, ReturnsAPortAListenerCanTake) {
  const int port = pickFreePort("127.0.0.1");
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  EXPECT_TRUE(canListenOn(port));
  EXPECT_GT(pickFreePort("localhost"), 0);
}

TEST(FreePort, ForeignOrBogusAddressesAreConfigErrors) {
  EXPECT_THROW(pickFreePort("no-such-host.invalid"), ConfigError);
  // TEST-NET-1 (RFC 5737) is never an address of this machine.
  EXPECT_THROW(pickFreePort("192.0.2.1"), ConfigError);
}

TEST(LaunchPlan, OneCommandPerLocalRankWithItsGlobalRank) {
  LaunchOptions options;
  options.nnodes = 2;
  options.nodeRank = 1;
  options.nprocPerNode = 3;
  options.worker = "sh";
  options.workerArgs = {"-c", "true"};
  options.useEnv = false;
  options.shutdownGraceS = 1.5;
  const LaunchPlan plan = makeLaunchPlan(options, {{"PATH", "/bin:/usr/bin"}});
  ASSERT_EQ(plan.commands.size(), 3u);
  EXPECT_EQ(plan.ranks, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(plan.masterPort, kDefaultMultiNodePort);  // multi-node without --master_port
  EXPECT_DOUBLE_EQ(plan.shutdownGraceS, 1.5);
  for (int local = 0; local < 3; ++local) {
    const WorkerCommand& command = plan.commands[static_cast<size_t>(local)];
    EXPECT_EQ(command.path.substr(command.path.size() - 3), "/sh");
    EXPECT_EQ(command.args, (std::vector<std::string>{"--local_rank=" + std::to_string(local), "-c", "true"}));
    EXPECT_EQ(command.env.at("RANK"), std::to_string(3 + local));
    EXPECT_EQ(command.env.at("MASTER_PORT"), std::to_string(kDefaultMultiNodePort));
    EXPECT_EQ(command.env.at("PATH"), "/bin:/usr/bin");
  }
}

TEST(LaunchPlan, PortIsTheGivenOneOrAFreeOneOnSingleNode) {
  LaunchOptions options;
  options.worker = "sh";
  options.masterPort = 29577;
  EXPECT_EQ(makeLaunchPlan(options, {}).masterPort, 29577);
  options.masterPort.reset();
  const int picked = makeLaunchPlan(options, {}).masterPort;
  EXPECT_GT(picked, 0);
  EXPECT_TRUE(canListenOn(picked));
}

TEST(LaunchPlan, MissingWorkerFailsBeforeAnythingElse) {
  LaunchOptions options;
  options.worker = "./definitely/not/here";
  EXPECT_THROW(makeLaunchPlan(options, {}), ConfigError);
}

}  // namespace
}  // namespace ddp::launcher

namespace ddp::launcher {
namespace {

TEST(LaunchPlan, RestartRaisesTheCountersAndPicksAFreshPort) {
  LaunchOptions options;
  options.worker = "sh";
  options.nprocPerNode = 2;
  options.maxRestarts = 3;
  const LaunchPlan first = makeLaunchPlan(options, {});
  EXPECT_TRUE(first.portPicked);
  for (const WorkerCommand& command : first.commands) {
    EXPECT_EQ(command.env.at("TORCHELASTIC_RESTART_COUNT"), "0");
    EXPECT_EQ(command.env.at("DDP_RESTART_COUNT"), "0");
    EXPECT_EQ(command.env.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  }
  const LaunchPlan second = restartPlan(first);
  const LaunchPlan third = restartPlan(second);
  EXPECT_EQ(third.attempt, 2);
  EXPECT_NE(second.masterPort, first.masterPort);
  EXPECT_NE(third.masterPort, second.masterPort);
  for (const WorkerCommand& command : third.commands) {
    EXPECT_EQ(command.env.at("TORCHELASTIC_RESTART_COUNT"), "2");
    EXPECT_EQ(command.env.at("DDP_RESTART_COUNT"), "2");
    EXPECT_EQ(command.env.at("MASTER_PORT"), std::to_string(third.masterPort));
  }
  EXPECT_EQ(third.commands[1].env.at("RANK"), "1");

  // A port the user gave (or a multi-node default) is the same on every attempt.
  options.masterPort = 29577;
  EXPECT_EQ(restartPlan(makeLaunchPlan(options, {})).commands[0].env.at("MASTER_PORT"), "29577");
}

TEST(LaunchPlan, LogDirIsCreatedAndLaidOutByTheRestartSetting) {
  ScratchDir dir;
  LaunchOptions options;
  options.worker = "sh";
  options.logDir = dir.file("a/b/logs");
  LaunchPlan plan = makeLaunchPlan(options, {});
  EXPECT_TRUE(testing::fileExists(options.logDir));
  EXPECT_EQ(rankLogPath(plan, 3), options.logDir + "/rank_3.log");
  EXPECT_FALSE(plan.outputToConsole());
  options.tee = true;
  options.maxRestarts = 1;
  plan = makeLaunchPlan(options, {});  // an existing directory is fine
  EXPECT_TRUE(plan.outputToConsole());
  EXPECT_EQ(rankLogPath(plan, 0), options.logDir + "/attempt_0/rank_0.log");
  EXPECT_EQ(rankLogPath(restartPlan(plan), 0), options.logDir + "/attempt_1/rank_0.log");

  const std::string file = dir.writeScript("file", "");
  for (const std::string& bad : {file, file + "/logs"}) {
    options.logDir = bad;
    EXPECT_THROW(makeLaunchPlan(options, {}), ConfigError) << bad;
  }
}

}  // namespace
}  // namespace ddp::launcher
