// torchrun's command-line surface (launcher/torchrun_compat.h): PET_* variables, torchrun's flags,
// how WORKER runs, and the error file. Expected values follow torchrun's documented behaviour
// (torch/distributed/run.py, argparse_util.py: PET_<DEST> is the default of --<dest>).
#include "launcher/torchrun_compat.h"

#include <sys/stat.h>

#include <fstream>

#include <gtest/gtest.h>

#include "common/error.h"
#include "launcher/error_file.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher {
namespace {

using Env = std::map<std::string, std::string>;

CommandLine parseWith(const std::vector<std::string>& args, const Env& env = {}) {
  return parseCommandLine(args, env);
}

std::string errorOf(const std::vector<std::string>& args, const Env& env = {}) {
  try {
    parseCommandLine(args, env);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

// A Kubeflow PyTorchJob pod (nprocPerNode set, no elastic policy): the operator's PET_* variables.
TEST(TorchrunEnv, APodsPetVariablesAreTheFlagsDefaults) {
  const Env pod = {{"PET_NNODES", "2"},          {"PET_NPROC_PER_NODE", "3"},
                   {"PET_NODE_RANK", "1"},       {"PET_MASTER_ADDR", "job-master-0"},
                   {"PET_MASTER_PORT", "23456"}, {"WORLD_SIZE", "2"},
                   {"RANK", "1"}};
  const CommandLine command = parseWith({"./worker", "config.yaml"}, pod);
  EXPECT_EQ(command.options.nnodes, 2);
  EXPECT_EQ(command.options.nprocPerNode, 3);
  EXPECT_EQ(command.options.nodeRank, 1);
  EXPECT_EQ(command.options.masterAddr, "job-master-0");
  EXPECT_EQ(command.options.masterPort, 23456);
  ASSERT_EQ(command.notes.size(), 1u);
  EXPECT_NE(command.notes[0].find("from torchrun's PET_* variables"), std::string::npos) << command.notes[0];
  EXPECT_NE(command.notes[0].find("--node_rank=1"), std::string::npos) << command.notes[0];
  // The pod's inherited WORLD_SIZE/RANK are the operator's: with --nnodes from PET_NNODES, no refusal.
  EXPECT_NO_THROW(torchrun::checkInheritedWorld(command.options, pod));
  // The command line wins over the environment.
  EXPECT_EQ(parseWith({"--nproc_per_node=2", "./worker"}, pod).options.nprocPerNode, 2);
  EXPECT_EQ(parseWith({"--nproc-per-node", "4", "./worker"}, pod).options.nprocPerNode, 4);
}

// An elastic policy: PET_NNODES=MIN:MAX, a c10d endpoint; the operator's MASTER_ADDR and node rank
// are not for the rendezvous.
TEST(TorchrunEnv, AnElasticPolicysVariablesMakeAnElasticJob) {
  const Env pod = {{"PET_NNODES", "1:4"},           {"PET_NPROC_PER_NODE", "2"},     {"PET_RDZV_BACKEND", "c10d"},
                   {"PET_RDZV_ENDPOINT", "job-c10d:29400"}, {"PET_RDZV_ID", "run7"}, {"PET_MAX_RESTARTS", "3"},
                   {"PET_MASTER_ADDR", "job-master-0"},     {"PET_MASTER_PORT", "23456"}, {"PET_NODE_RANK", "2"}};
  const LaunchOptions options = parseWith({"./worker"}, pod).options;
  EXPECT_TRUE(options.elastic.enabled);
  EXPECT_EQ(options.elastic.minNodes, 1);
  EXPECT_EQ(options.elastic.maxNodes, 4);
  EXPECT_EQ(options.elastic.rdzvId, "run7");
  EXPECT_EQ(options.maxRestarts, 3);
  EXPECT_EQ(options.masterAddr, "job-c10d");
  EXPECT_EQ(options.masterPort, 29400);
}

TEST(TorchrunEnv, SwitchesTakeOneOrZero) {
  EXPECT_EQ(parseWith({"./worker"}, {{"PET_STANDALONE", "1"}}).options.nnodes, 1);
  EXPECT_TRUE(parseWith({"./worker"}, {{"PET_STANDALONE", "0"}}).notes.empty());
  EXPECT_NE(errorOf({"./worker"}, {{"PET_STANDALONE", "yes"}}).find("PET_STANDALONE=yes"), std::string::npos);
}

TEST(TorchrunEnv, AnotherNodesWorldWithoutHowToMeetIsRefused) {
  const Env pod = {{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "job-master-0"}};
  const LaunchOptions alone = parseWith({"./worker"}, pod).options;
  try {
    torchrun::checkInheritedWorld(alone, pod);
    FAIL() << "a pod of two trained alone";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("one of WORLD_SIZE=2 processes (RANK=1"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("--nnodes=2 --node_rank=$RANK"), std::string::npos) << error.what();
  }
  EXPECT_NO_THROW(torchrun::checkInheritedWorld(parseWith({"--standalone", "./worker"}, pod).options, pod));
  EXPECT_NO_THROW(torchrun::checkInheritedWorld(parseWith({"--nnodes=1", "./worker"}, pod).options, pod));
  EXPECT_NO_THROW(torchrun::checkInheritedWorld(alone, {{"WORLD_SIZE", "1"}}));
}

TEST(TorchrunFlags, RendezvousFlagsKeepTorchrunsMeaning) {
  // c10d numbers the nodes itself: N nodes is an elastic job of exactly N; --node_rank is ignored.
  const CommandLine c10d = parseWith({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv-endpoint=node0:29400",
                                      "--rdzv_id=42", "--node_rank=1", "./worker"});
  EXPECT_TRUE(c10d.options.elastic.enabled);
  EXPECT_EQ(c10d.options.elastic.minNodes, 2);
  EXPECT_EQ(c10d.options.elastic.maxNodes, 2);
  EXPECT_EQ(c10d.options.elastic.rdzvId, "42");
  ASSERT_EQ(c10d.notes.size(), 1u);
  EXPECT_NE(c10d.notes[0].find("--node_rank is ignored"), std::string::npos);
  // torchrun's single-node recipe: --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1.
  const LaunchOptions single = parseWith({"--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--nnodes=1", "w"}).options;
  EXPECT_FALSE(single.elastic.enabled);
  EXPECT_FALSE(single.masterPort.has_value());  // a free port
  // --rdzv_conf: join_timeout, last_call_timeout, heartbeats = interval x attempts (torchrun's keep-alive).
  const LaunchOptions conf = parseWith({"--nnodes=1:3", "--rdzv_token_file=t",
                                        "--rdzv_conf=join_timeout=900,last_call_timeout=5,keep_alive_interval=2,"
                                        "keep_alive_max_attempt=4,read_timeout=60,is_host=true", "w"}).options;
  EXPECT_DOUBLE_EQ(conf.elastic.rdzvTimeoutS, 900);
  EXPECT_DOUBLE_EQ(conf.elastic.lastCallS, 5);
  EXPECT_DOUBLE_EQ(conf.elastic.heartbeatTimeoutS, 8);
  // A fixed job's --rdzv_id is its TORCHELASTIC_RUN_ID.
  LaunchOptions named = parseWith({"--rdzv_id=abc", "w"}).options;
  assignRunId(named);
  EXPECT_EQ(named.runId, "abc");
  // Without one: torchrun's run.py, a fresh uuid4 for one node with --standalone or without
  // --master_port and --rdzv_endpoint (the same for every rank and restart: made once), else "none".
  for (const std::vector<std::string>& args : {std::vector<std::string>{"w"}, {"--standalone", "w"}}) {
    LaunchOptions fresh = parseWith(args).options;
    assignRunId(fresh);
    LaunchOptions again = parseWith(args).options;
    assignRunId(again);
    EXPECT_EQ(fresh.runId.size(), 36u) << fresh.runId;
    EXPECT_EQ(fresh.runId.find_first_not_of("0123456789abcdef-"), std::string::npos) << fresh.runId;
    EXPECT_EQ(fresh.runId.substr(14, 1), "4") << fresh.runId;  // version 4
    EXPECT_NE(std::string("89ab").find(fresh.runId[19]), std::string::npos) << fresh.runId;  // RFC 4122 variant
    EXPECT_NE(fresh.runId, again.runId);
  }
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--master_port=29555", "w"}, {"--rdzv_endpoint=127.0.0.1:29555", "w"},
        {"--nnodes=2", "--node_rank=0", "--master_addr=10.0.0.1", "--rdzv_token_file=t", "w"}}) {
    LaunchOptions fixed = parseWith(args).options;
    assignRunId(fixed);
    EXPECT_EQ(fixed.runId, "none") << args.front();
  }
  // Two nodes only once the srun step says so: still torchrun's "none".
  LaunchOptions stepped = parseWith({"w"}).options;
  stepped.nnodes = 2;
  assignRunId(stepped);
  EXPECT_EQ(stepped.runId, "none");
  EXPECT_NE(errorOf({"--rdzv_backend=etcd", "w"}).find("use --rdzv_backend=c10d"), std::string::npos);
  EXPECT_NE(errorOf({"--nnodes=1:2", "--rdzv_conf=bogus=1", "w"}).find("unknown key 'bogus'"), std::string::npos);
}

TEST(TorchrunFlags, OutputAndProcessFlags) {
  const LaunchOptions tee = parseWith({"--log-dir=logs", "--tee", "3", "w", "3"}).options;
  EXPECT_EQ(tee.logDir, "logs");
  EXPECT_TRUE(tee.tee);
  EXPECT_EQ(tee.workerArgs, std::vector<std::string>{"3"});
  EXPECT_TRUE(parseWith({"--log_dir=logs", "-t", "3", "w"}).options.tee);
  EXPECT_FALSE(parseWith({"--log_dir=logs", "--tee=0", "w"}).options.tee);
  EXPECT_FALSE(parseWith({"--log_dir=logs", "-r", "3", "w"}).options.tee);
  EXPECT_NE(errorOf({"--log_dir=logs", "--redirects=1", "w"}).find("give --redirects=3 (or 0)"), std::string::npos);
  // Without --log_dir, as torchrun: a temporary directory (made by the launcher, not the parser).
  EXPECT_TRUE(parseWith({"--redirects=3", "w"}).options.logDirTemporary);
  EXPECT_FALSE(parseWith({"--log_dir=logs", "--redirects=3", "w"}).options.logDirTemporary);
  const LaunchOptions filtered = parseWith({"--local-ranks-filter=0,2", "--ranks_filter=5", "w"}).options;
  EXPECT_EQ(filtered.localRanksFilter, (std::vector<int>{0, 2}));
  EXPECT_EQ(filtered.ranksFilter, (std::vector<int>{5}));
  const LaunchOptions other = parseWith({"--monitor-interval=5", "--role=trainer", "--start-method=spawn",
                                         "--shutdown-timeout=12", "w"}).options;
  EXPECT_EQ(other.role, "trainer");
  EXPECT_DOUBLE_EQ(other.shutdownGraceS, 12);
  for (const char* word : {"gpu", "cpu", "auto"}) {
    const LaunchOptions nproc = parseWith({std::string("--nproc_per_node=") + word, "w"}).options;
    EXPECT_TRUE(nproc.nprocAuto);
    EXPECT_EQ(nproc.nprocWord, word);
  }
  // Flags torchrun has and ddp-launch does not: what to use instead, not a guess at a spelling.
  const std::string localAddr = errorOf({"--local_addr=10.0.0.2", "w"});
  EXPECT_NE(localAddr.find("torchrun's --local_addr is not a ddp-launch option"), std::string::npos) << localAddr;
  EXPECT_EQ(localAddr.find("did you mean"), std::string::npos) << localAddr;
}

TEST(TorchrunFlags, WorkerRunsAsTorchrunRunsIt) {
  testing::ScratchDir dir;
  const std::string plain = dir.file("train.py");
  std::ofstream(plain) << "print('hi')\n";
  const LaunchOptions python = parseWith({plain, "--lr", "0.1"}).options;
  EXPECT_EQ(python.worker, "python3");
  EXPECT_EQ(python.workerArgs, (std::vector<std::string>{"-u", plain, "--lr", "0.1"}));
  // An executable script with #! picks its own interpreter.
  const std::string shebang = dir.file("tool.py");
  std::ofstream(shebang) << "#!/usr/bin/env python3\nprint('hi')\n";
  ::chmod(shebang.c_str(), 0755);
  EXPECT_EQ(parseWith({shebang}).options.worker, shebang);
  EXPECT_EQ(parseWith({"--no-python", plain}).options.worker, plain);
  const LaunchOptions module = parseWith({"-m", "torch.utils.collect_env", "x"}).options;
  EXPECT_EQ(module.worker, "python3");
  EXPECT_EQ(module.workerArgs, (std::vector<std::string>{"-u", "-m", "torch.utils.collect_env", "x"}));
  EXPECT_EQ(parseWith({"--run_path", dir.file("script")}).options.workerArgs,
            (std::vector<std::string>{"-u", dir.file("script")}));
  EXPECT_NE(errorOf({"--no_python", "-m", "mod"}).find("keep one"), std::string::npos);
}

// torchrun's error file, as torch.distributed.elastic's ErrorHandler.record_exception writes it.
TEST(ErrorFile, ShowsTheMessageAndTheInnermostFrame) {
  testing::ScratchDir dir;
  const std::string path = dir.file("error.json");
  std::ofstream(path) << R"({"message": {"message": "ValueError: bad learning rate", "extraInfo": )"
                      << R"({"py_callstack": "Traceback (most recent call last):\n  File \"/w/run.py\", line 20, )"
                      << R"(in wrapper\n    f()\n  File \"/w/train.py\", line 7, in main\n    raise ValueError\n)"
                      << R"(ValueError: bad learning rate\n", "timestamp": "1700000000"}}})";
  EXPECT_EQ(readErrorFile(path), "ValueError: bad learning rate (/w/train.py, line 7, in main)");
  std::ofstream(path) << R"({"message": "worker: config: train.lr must be positive"})";
  EXPECT_EQ(readErrorFile(path), "worker: config: train.lr must be positive");
  std::ofstream(path) << "not json";
  EXPECT_EQ(readErrorFile(path), "");
  EXPECT_EQ(readErrorFile(dir.file("absent.json")), "");
}

}  // namespace
}  // namespace ddp::launcher
