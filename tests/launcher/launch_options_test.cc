// Unit tests of the ddp-launch command line (no processes started).
#include "launcher/launch_options.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"

namespace ddp::launcher {
namespace {

LaunchOptions parse(const std::vector<std::string>& args) {
  const CommandLine command = parseCommandLine(args);
  EXPECT_EQ(command.action, CommandAction::kRun);
  return command.options;
}

// The ConfigError's message, or "" when parsing succeeded.
std::string errorOf(const std::vector<std::string>& args) {
  try {
    parseCommandLine(args);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(LaunchOptions, DefaultsMatchTorchrun) {
  const LaunchOptions options = parse({"./worker"});
  EXPECT_EQ(options.nprocPerNode, 1);
  EXPECT_EQ(options.nnodes, 1);
  EXPECT_EQ(options.nodeRank, 0);
  EXPECT_EQ(options.masterAddr, "127.0.0.1");
  EXPECT_FALSE(options.masterPort.has_value());
  EXPECT_TRUE(options.useEnv);
  EXPECT_DOUBLE_EQ(options.shutdownGraceS, 5.0);
  EXPECT_EQ(options.worker, "./worker");
  EXPECT_TRUE(options.workerArgs.empty());
}

// torchrun's --shutdown_timeout defaults to TORCH_ELASTIC_SHUTDOWN_TIMEOUT (else 30 s): a job script
// that set it for torchrun gets that grace here too; a flag given wins.
TEST(LaunchOptions, TorchElasticShutdownTimeoutSetsTheGraceWhenNoFlagDoes) {
  ::setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "12.5", 1);
  EXPECT_DOUBLE_EQ(parse({"w"}).shutdownGraceS, 12.5);
  EXPECT_DOUBLE_EQ(parse({"--shutdown_grace_s=2", "w"}).shutdownGraceS, 2.0);
  EXPECT_DOUBLE_EQ(parse({"--shutdown_timeout=3", "w"}).shutdownGraceS, 3.0);
  ::setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon", 1);
  EXPECT_EQ(errorOf({"w"}), "environment: TORCH_ELASTIC_SHUTDOWN_TIMEOUT='soon' (torchrun's default for "
                            "--shutdown_timeout) must be a number of seconds from 0 to 86400; fix or unset it");
  ::unsetenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  EXPECT_DOUBLE_EQ(parse({"w"}).shutdownGraceS, 5.0);
}

TEST(LaunchOptions, MinColonMaxNodesMakesAnElasticJobWithTorchrunsDefaults) {
  const LaunchOptions fixed = parse({"--nnodes=2", "w"});
  EXPECT_FALSE(fixed.elastic.enabled);
  const LaunchOptions options = parse({"--nnodes", "2:4", "w"});
  EXPECT_TRUE(options.elastic.enabled);
  EXPECT_EQ(options.elastic.minNodes, 2);
  EXPECT_EQ(options.elastic.maxNodes, 4);
  EXPECT_EQ(options.nnodes, 4);  // a multi-node job for every check that asks
  EXPECT_EQ(options.elastic.rdzvId, "default");
  EXPECT_DOUBLE_EQ(options.elastic.lastCallS, 30);
  EXPECT_DOUBLE_EQ(options.elastic.heartbeatTimeoutS, 30);
  EXPECT_DOUBLE_EQ(options.elastic.rdzvTimeoutS, 600);
  const LaunchOptions tuned = parse({"--nnodes=1:1", "--rdzv-id=job.7", "--rdzv_last_call_s=0.5",
                                     "--heartbeat_timeout_s", "3", "--rdzv_timeout_s=20", "w", "--nnodes=9"});
  EXPECT_TRUE(tuned.elastic.enabled);
  EXPECT_EQ(tuned.elastic.maxNodes, 1);
  EXPECT_EQ(tuned.elastic.rdzvId, "job.7");
  EXPECT_DOUBLE_EQ(tuned.elastic.lastCallS, 0.5);
  EXPECT_DOUBLE_EQ(tuned.elastic.heartbeatTimeoutS, 3);
  EXPECT_DOUBLE_EQ(tuned.elastic.rdzvTimeoutS, 20);
  EXPECT_EQ(tuned.workerArgs, std::vector<std::string>{"--nnodes=9"});
  const LaunchOptions endpoint = parse({"--nnodes=1:2", "--rdzv_endpoint=node1:29400", "w"});
  EXPECT_EQ(endpoint.masterAddr, "node1");
  EXPECT_EQ(endpoint.masterPort, 29400);
  EXPECT_EQ(parse({"--rdzv_endpoint", "[fd00::1]:29401", "w"}).masterAddr, "fd00::1");
  EXPECT_EQ(parse({"--rdzv_endpoint", "[fd00::1]:29401", "w"}).masterPort, 29401);
  EXPECT_EQ(parse({"--rdzv_endpoint=node2", "w"}).masterAddr, "node2");
  EXPECT_FALSE(parse({"--rdzv_endpoint=node2", "w"}).masterPort.has_value());
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--nnodes=3:2", "w"}, {"--nnodes=0:2", "w"}, {"--nnodes=1:2", "--node_rank=0", "w"},
        {"--nnodes=1:", "w"}, {"--nnodes=a:2", "w"}, {"--nnodes=1:2", "--rdzv_id=a/b", "w"},
        {"--nnodes=1:2", "--heartbeat_timeout_s=0.1", "w"}, {"--nnodes=1:2", "--standalone", "w"},
        {"--heartbeat_timeout_s=5", "w"}, {"--rdzv_endpoint=a:1", "--master_addr=b", "w"},
        {"--rdzv_endpoint=:29500", "w"}, {"--rdzv_endpoint=a:x", "w"},
        {"--nnodes=1:2", "--rdzv_last_call_s=10", "--rdzv_timeout_s=10", "w"}}) {
    EXPECT_THROW(parse(bad), ConfigError) << bad[0] << " " << bad[1];
  }
}

TEST(LaunchOptions, AcceptsUnderscoreAndDashSpellingsWithSpaceOrEquals) {
  for (const std::string name : {"--nproc_per_node", "--nproc-per-node"}) {
    EXPECT_EQ(parse({name, "4", "w"}).nprocPerNode, 4) << name;
    EXPECT_EQ(parse({name + "=4", "w"}).nprocPerNode, 4) << name;
  }
  for (const std::string name : {"--node_rank", "--node-rank"}) {
    EXPECT_EQ(parse({"--nnodes", "3", name, "2", "w"}).nodeRank, 2) << name;
  }
  for (const std::string name : {"--master_addr", "--master-addr"}) {
    EXPECT_EQ(parse({name + "=10.0.0.7", "w"}).masterAddr, "10.0.0.7") << name;
  }
  for (const std::string name : {"--master_port", "--master-port"}) {
    EXPECT_EQ(parse({name, "29511", "w"}).masterPort, 29511) << name;
  }
  for (const std::string name : {"--shutdown_grace_s", "--shutdown-grace-s"}) {
    EXPECT_DOUBLE_EQ(parse({name + "=0.25", "w"}).shutdownGraceS, 0.25) << name;
  }
  EXPECT_EQ(parse({"--nnodes=2", "--node-rank=1", "w"}).nnodes, 2);
}

TEST(LaunchOptions, EverythingAfterWorkerGoesToTheWorkerUntouched) {
  const std::vector<std::string> workerArgs{"--nproc_per_node", "7", "--bogus", "-h", "--help", "--", "a b", ""};
  std::vector<std::string> args{"--nproc_per_node=2", "./worker"};
  args.insert(args.end(), workerArgs.begin(), workerArgs.end());
  const LaunchOptions options = parse(args);
  EXPECT_EQ(options.nprocPerNode, 2);
  EXPECT_EQ(options.worker, "./worker");
  EXPECT_EQ(options.workerArgs, workerArgs);
}

TEST(LaunchOptions, DoubleDashEndsTheLauncherOptions) {
  const LaunchOptions options = parse({"--nnodes", "1", "--", "--odd-worker-name", "--x"});
  EXPECT_EQ(options.worker, "--odd-worker-name");
  EXPECT_EQ(options.workerArgs, std::vector<std::string>{"--x"});
  // As the pinned torchrun (its argparse): a "--" right after the script goes, unless one came before
  // it; elsewhere it stays. (torchrun argv.py -- --x: ['argv.py', '--x']; -- argv.py -- b: ['--', 'b'];
  // argv.py a -- b: ['a', '--', 'b'].)
  EXPECT_EQ(parse({"w", "--", "--x"}).workerArgs, std::vector<std::string>{"--x"});
  EXPECT_EQ(parse({"--", "w", "--", "b"}).workerArgs, (std::vector<std::string>{"--", "b"}));
  EXPECT_EQ(parse({"w", "a", "--", "b"}).workerArgs, (std::vector<std::string>{"a", "--", "b"}));
  EXPECT_EQ(parse({"s.py", "--", "--x"}).workerArgs, (std::vector<std::string>{"-u", "s.py", "--x"}));  // python3
}

TEST(LaunchOptions, ValueOfAnOptionIsNotMistakenForTheWorker) {
  const LaunchOptions options = parse({"--master_addr", "node0", "--nproc_per_node", "3", "train"});
  EXPECT_EQ(options.masterAddr, "node0");
  EXPECT_EQ(options.worker, "train");
}

TEST(LaunchOptions, UseEnvSpellings) {
  EXPECT_TRUE(parse({"--use_env", "w"}).useEnv);
  EXPECT_TRUE(parse({"--use-env=true", "w"}).useEnv);
  EXPECT_FALSE(parse({"--use_env=false", "w"}).useEnv);
  EXPECT_FALSE(parse({"--use-env=0", "w"}).useEnv);
  EXPECT_FALSE(parse({"--no_use_env", "w"}).useEnv);
  EXPECT_FALSE(parse({"--no-use-env", "w"}).useEnv);
  // A bare --use_env never swallows WORKER as its value.
  EXPECT_EQ(parse({"--use_env", "false"}).worker, "false");
  EXPECT_NE(errorOf({"--use_env=true", "--no_use_env", "w"}).find("contradict"), std::string::npos);
  EXPECT_NE(errorOf({"--use_env=maybe", "w"}).find("--use_env must be true or false"), std::string::npos);
}

TEST(LaunchOptions, MasterPortZeroMeansPickAFreeOneOnSingleNodeOnly) {
  EXPECT_FALSE(parse({"--master_port=0", "w"}).masterPort.has_value());
  EXPECT_NE(errorOf({"--nnodes=2", "--master_port=0", "w"}).find("--master_port=0"), std::string::npos);
  EXPECT_NE(errorOf({"--master_port=65536", "w"}).find("--master_port"), std::string::npos);
}

TEST(LaunchOptions, Standalone) {
  EXPECT_EQ(parse({"--standalone", "--nproc_per_node=2", "w"}).nnodes, 1);
  EXPECT_NE(errorOf({"--standalone", "--nnodes=2", "w"}).find("--standalone"), std::string::npos);
}

TEST(LaunchOptions, RanksFollowTheFormulas) {
  const LaunchOptions options = parse({"--nnodes=3", "--node_rank=2", "--nproc_per_node=4", "w"});
  EXPECT_EQ(options.worldSize(), 3 * 4);
  for (int local = 0; local < 4; ++local) EXPECT_EQ(options.globalRank(local), 2 * 4 + local);
}

TEST(LaunchOptions, BadNumbersSayWhichFlagAndHowToFixIt) {
  for (const std::string value : {"0", "-1", "abc", "", "2x", "99999999999"}) {
    const std::string error = errorOf({"--nproc_per_node=" + value, "w"});
    EXPECT_NE(error.find("--nproc_per_node must be a whole number from 1"), std::string::npos) << value << ": " << error;
    EXPECT_NE(error.find("e.g. --nproc_per_node=4"), std::string::npos) << error;
  }
  EXPECT_NE(errorOf({"--nnodes=0", "w"}).find("--nnodes"), std::string::npos);
  EXPECT_NE(errorOf({"--node_rank=-1", "w"}).find("--node_rank"), std::string::npos);
  EXPECT_NE(errorOf({"--shutdown_grace_s=-1", "w"}).find("--shutdown_grace_s"), std::string::npos);
  EXPECT_NE(errorOf({"--shutdown_grace_s=soon", "w"}).find("--shutdown_grace_s"), std::string::npos);
  EXPECT_NE(errorOf({"--master_addr=", "w"}).find("--master_addr is empty"), std::string::npos);
}

TEST(LaunchOptions, NodeRankMustBeBelowNnodes) {
  EXPECT_EQ(errorOf({"--nnodes=2", "--node_rank=2", "w"}),
            "--node_rank 2 is out of range for --nnodes 2: give each node a distinct rank from 0 to 1");
  EXPECT_NE(errorOf({"--node_rank=1", "w"}).find("out of range for --nnodes 1"), std::string::npos);
}

TEST(LaunchOptions, MissingWorker) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{}, {"--nproc_per_node=2"}, {"--nproc_per_node", "2", "--"}}) {
    EXPECT_NE(errorOf(args).find("missing WORKER"), std::string::npos);
  }
}

TEST(LaunchOptions, UnknownOptionSuggestsTheClosestOne) {
  EXPECT_NE(errorOf({"--nprc_per_node=2", "w"}).find("unknown option '--nprc_per_node=2' (did you mean "
                                                      "'--nproc_per_node'?)"),
            std::string::npos);
  EXPECT_NE(errorOf({"--master-adr", "x", "w"}).find("did you mean '--master_addr'?"), std::string::npos);
  const std::string error = errorOf({"--frobnicate", "w"});
  EXPECT_NE(error.find("unknown option '--frobnicate'"), std::string::npos);
  EXPECT_EQ(error.find("did you mean"), std::string::npos) << error;
  EXPECT_NE(errorOf({"-x", "w"}).find("unknown option '-x'"), std::string::npos);
  // A long option with one dash (cxxopts would read its letters as short options: "Option 'n' does not exist").
  EXPECT_EQ(errorOf({"-nproc_per_node=2", "w"}), "option '-nproc_per_node=2' has one dash; long options take two: "
                                                 "--nproc_per_node=2");
  EXPECT_EQ(errorOf({"-nnodes", "2", "w"}), "option '-nnodes' has one dash; long options take two: --nnodes");
}

// torchrun's argparse takes an unambiguous prefix of a long option (torchrun --nnode=1 runs).
TEST(LaunchOptions, AnUnambiguousPrefixIsTheOptionAsInTorchrun) {
  const LaunchOptions o = parseCommandLine({"--nproc_per=3", "--master-p", "29511", "--max_rest=2", "w"}).options;
  EXPECT_EQ(o.nprocPerNode, 3);
  EXPECT_EQ(o.masterPort, 29511);
  EXPECT_EQ(o.maxRestarts, 2);
  EXPECT_EQ(errorOf({"--rdzv_t=5", "w"}), "ambiguous option '--rdzv_t=5' could match --rdzv_timeout_s, "
                                          "--rdzv_token_file; spell the option out");
}

TEST(LaunchOptions, MissingValue) {
  EXPECT_NE(errorOf({"--nproc_per_node"}).find("'--nproc_per_node' needs a value"), std::string::npos);
}

TEST(LaunchOptions, HelpAndVersion) {
  for (const std::string flag : {"-h", "--help"}) {
    const CommandLine command = parseCommandLine({flag});
    EXPECT_EQ(command.action, CommandAction::kHelp);
    for (const char* name : {"--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port",
                             "--use_env", "--shutdown_grace_s", "WORKER"}) {
      EXPECT_NE(command.text.find(name), std::string::npos) << name;
    }
  }
  // Help wins over a missing worker, and a worker's own --help is the worker's.
  EXPECT_EQ(parseCommandLine({"--nproc_per_node=2", "--help"}).action, CommandAction::kHelp);
  EXPECT_EQ(parseCommandLine({"w", "--help"}).action, CommandAction::kRun);
  const CommandLine version = parseCommandLine({"--version"});
  EXPECT_EQ(version.action, CommandAction::kVersion);
  EXPECT_EQ(version.text.rfind("ddp-launch ", 0), 0u);
}

}  // namespace
}  // namespace ddp::launcher

namespace ddp::launcher {
namespace {

TEST(LaunchOptions, RestartAndLogOptionsInBothSpellings) {
  const LaunchOptions defaults = parse({"w"});
  EXPECT_EQ(defaults.maxRestarts, 0);
  EXPECT_TRUE(defaults.logDir.empty());
  EXPECT_FALSE(defaults.tee);
  for (const std::string name : {"--max_restarts", "--max-restarts"}) {
    EXPECT_EQ(parse({name, "3", "w"}).maxRestarts, 3) << name;
    EXPECT_EQ(parse({name + "=0", "w"}).maxRestarts, 0) << name;
  }
  for (const std::string name : {"--log_dir", "--log-dir"}) {
    const LaunchOptions options = parse({name, "logs/run1", "--tee", "w", "--tee"});
    EXPECT_EQ(options.logDir, "logs/run1") << name;
    EXPECT_TRUE(options.tee);
    EXPECT_EQ(options.workerArgs, std::vector<std::string>{"--tee"});  // after WORKER: the worker's
  }
  EXPECT_FALSE(parse({"--log_dir=l", "w"}).tee);
}

TEST(LaunchOptions, BadRestartAndLogOptionsSayHowToFixThem) {
  EXPECT_NE(errorOf({"--max_restarts=-1", "w"}).find("--max_restarts must be a whole number from 0"),
            std::string::npos);
  EXPECT_NE(errorOf({"--max_restarts=many", "w"}).find("--max_restarts"), std::string::npos);
  EXPECT_NE(errorOf({"--log_dir=", "w"}).find("--log_dir is empty"), std::string::npos);
  EXPECT_TRUE(parse({"--tee", "w"}).logDirTemporary);  // no --log_dir: a temporary one, as torchrun
  EXPECT_NE(errorOf({"--max_restrats=2", "w"}).find("did you mean '--max_restarts'"), std::string::npos);
  EXPECT_EQ(errorOf({"--max_restart=2", "w"}), "");  // a prefix, which torchrun takes too
}

}  // namespace
}  // namespace ddp::launcher
