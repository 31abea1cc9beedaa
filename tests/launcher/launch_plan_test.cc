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
#include "tests/support/loopback.h"

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
  // The worker left out (`ddp-launch --nproc_per_node=2 configs/x.yaml`): say to name it first.
  const std::string config = dir.file("x.yaml");
  ::close(::creat(config.c_str(), 0644));
  EXPECT_EQ(errorOf(config, ""), "worker '" + config + "' is a config file, not a program; name the worker program "
                                 "first and give it the config, e.g. ddp-launch ... ./build/worker " + config);
}

// Whether a listener without SO_REUSEADDR can take `port` on 127.0.0.1 right now.
bool canListenOn(int port) {
  const int fd = ddp::test::listenLoopback(static_cast<uint16_t>(port), 1);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
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
  // The nodes of a multi-node job share a token; here the inherited DDP_RDZV_TOKEN.
  const LaunchPlan plan =
      makeLaunchPlan(options, {{"PATH", "/bin:/usr/bin"}, {"DDP_RDZV_TOKEN", "shared-multi-node-token"}});
  ASSERT_EQ(plan.commands.size(), 3u);
  EXPECT_EQ(plan.ranks, (std::vector<int>{3, 4, 5}));
  EXPECT_FALSE(plan.storeSocket) << "only node 0 serves the store";
  EXPECT_EQ(plan.masterPort, kDefaultMultiNodePort);  // multi-node without --master_port
  EXPECT_DOUBLE_EQ(plan.shutdownGraceS, 1.5);
  for (int local = 0; local < 3; ++local) {
    const WorkerCommand& command = plan.commands[static_cast<size_t>(local)];
    EXPECT_EQ(command.path.substr(command.path.size() - 3), "/sh");
    EXPECT_EQ(command.args, (std::vector<std::string>{"--local_rank=" + std::to_string(local), "-c", "true"}));
    EXPECT_EQ(command.env.at("RANK"), std::to_string(3 + local));
    EXPECT_EQ(command.env.at("MASTER_PORT"), std::to_string(kDefaultMultiNodePort));
    EXPECT_EQ(command.env.at("PATH"), "/bin:/usr/bin");
    EXPECT_EQ(command.env.at("DDP_RDZV_TOKEN"), "shared-multi-node-token");
    EXPECT_EQ(command.env.count("DDP_STORE_FD"), 0u);
    EXPECT_EQ(command.inheritFd, -1);
  }
}

TEST(LaunchPlan, MultiNodeWithoutATokenStartsNothing) {
  LaunchOptions options;
  options.nnodes = 2;
  options.worker = "sh";
  try {
    makeLaunchPlan(options, {{"PATH", "/bin:/usr/bin"}});
    FAIL() << "a multi-node plan without a token";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--rdzv_token_file"), std::string::npos) << e.what();
  }
}

TEST(LaunchPlan, ASingleNodeJobGetsAFreshTokenAndRankZeroTheBoundStoreSocket) {
  LaunchOptions options;
  options.nprocPerNode = 3;
  options.worker = "sh";
  const LaunchPlan plan = makeLaunchPlan(options, {{"PATH", "/bin:/usr/bin"}});
  ASSERT_TRUE(plan.storeSocket);
  EXPECT_EQ(plan.storeSocket->port(), plan.masterPort);
  const std::string token = plan.commands[0].env.at("DDP_RDZV_TOKEN");
  EXPECT_EQ(token.size(), 32u);
  EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos);
  for (const WorkerCommand& command : plan.commands) EXPECT_EQ(command.env.at("DDP_RDZV_TOKEN"), token);
  EXPECT_EQ(plan.commands[0].inheritFd, plan.storeSocket->fd());
  EXPECT_EQ(plan.commands[0].env.at("DDP_STORE_FD"), std::to_string(plan.storeSocket->fd()));
  for (int local : {1, 2}) EXPECT_EQ(plan.commands[local].inheritFd, -1);
  // Another job's plan has another token.
  EXPECT_NE(makeLaunchPlan(options, {{"PATH", "/bin:/usr/bin"}}).commands[0].env.at("DDP_RDZV_TOKEN"), token);
  // A restart with a picked port binds a fresh socket on another port and hands that one over.
  const LaunchPlan next = restartPlan(plan);
  ASSERT_TRUE(next.storeSocket);
  EXPECT_NE(next.masterPort, plan.masterPort);
  EXPECT_EQ(next.commands[0].inheritFd, next.storeSocket->fd());
  EXPECT_EQ(next.commands[0].env.at("DDP_STORE_FD"), std::to_string(next.storeSocket->fd()));
  EXPECT_EQ(next.commands[0].env.at("DDP_RDZV_TOKEN"), token);
}

TEST(LaunchPlan, APythonWorkerBindsItsOwnPort) {
  // torch.distributed's rank 0 hosts its own TCPStore on MASTER_PORT: the launcher keeps it free.
  LaunchOptions options;
  options.nprocPerNode = 2;
  options.worker = "/usr/bin/python3";
  const LaunchPlan plan = makeLaunchPlan(options, {{"PATH", "/bin:/usr/bin"}});
  EXPECT_FALSE(plan.storeSocket);
  EXPECT_EQ(plan.commands[0].inheritFd, -1);
  EXPECT_GT(plan.masterPort, 0);
}

// The argv each rank gets under --use_env=false for `WORKER ARGS...`.
std::vector<std::string> legacyArgs(const std::string& worker, std::vector<std::string> args) {
  LaunchOptions options;
  options.nprocPerNode = 2;
  options.worker = worker;
  options.workerArgs = std::move(args);
  options.useEnv = false;
  const LaunchPlan plan = makeLaunchPlan(options, {});
  EXPECT_EQ(plan.commands[1].args[0] == "--local_rank=1", plan.commands[0].args[0] == "--local_rank=0");
  return plan.commands[0].args;
}

TEST(LaunchPlan, LegacyLocalRankGoesAfterThePythonScriptAsTorchDistributedLaunchPutsIt) {
  // CPython reads options up to the script (or -m module, -c command); an unknown --local_rank
  // before it is an error ("unknown option --local_rank"). The script's argparse reads it after.
  ScratchDir dir;
  using Args = std::vector<std::string>;
  for (const std::string name : {"python", "python3", "python3.11"}) {
    const std::string python = dir.writeScript(name, "exit 0");
    EXPECT_EQ(legacyArgs(python, {"train.py", "--epochs=2"}), (Args{"train.py", "--local_rank=0", "--epochs=2"}))
        << name;
  }
  const std::string python = dir.file("python3");
  EXPECT_EQ(legacyArgs(python, {"-u", "-X", "dev", "-W", "ignore", "-B", "train.py", "x"}),
            (Args{"-u", "-X", "dev", "-W", "ignore", "-B", "train.py", "--local_rank=0", "x"}));
  EXPECT_EQ(legacyArgs(python, {"-uXdev", "-Wignore", "train.py"}), (Args{"-uXdev", "-Wignore", "train.py", "--local_rank=0"}));
  EXPECT_EQ(legacyArgs(python, {"-uW", "ignore", "train.py"}), (Args{"-uW", "ignore", "train.py", "--local_rank=0"}));
  EXPECT_EQ(legacyArgs(python, {"-m", "pkg.train", "cfg"}), (Args{"-m", "pkg.train", "--local_rank=0", "cfg"}));
  EXPECT_EQ(legacyArgs(python, {"-um", "pkg.train"}), (Args{"-um", "pkg.train", "--local_rank=0"}));
  EXPECT_EQ(legacyArgs(python, {"-mpkg.train", "cfg"}), (Args{"-mpkg.train", "--local_rank=0", "cfg"}));
  EXPECT_EQ(legacyArgs(python, {"-c", "import sys", "a"}), (Args{"-c", "import sys", "--local_rank=0", "a"}));
  EXPECT_EQ(legacyArgs(python, {"--check-hash-based-pycs", "never", "t.py"}),
            (Args{"--check-hash-based-pycs", "never", "t.py", "--local_rank=0"}));
  EXPECT_EQ(legacyArgs(python, {"--", "-odd-name.py"}), (Args{"--", "-odd-name.py", "--local_rank=0"}));
  // Not an interpreter (a name that only starts with "python", or a program): first, as before.
  EXPECT_EQ(legacyArgs(dir.writeScript("python-trainer", "exit 0"), {"train.py"}), (Args{"--local_rank=0", "train.py"}));
  EXPECT_EQ(legacyArgs(dir.writeScript("worker", "exit 0"), {"cfg.yaml"}), (Args{"--local_rank=0", "cfg.yaml"}));
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
