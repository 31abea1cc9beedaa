// Runs the real ddp-launch: the environment and arguments each worker sees, its prefixed
// output, and the refusal of bad input before anything starts.
#include <cstdio>
#include <regex>

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "tests/launcher/launched_process.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::seconds;

class LaunchEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { becomeSubreaper(); }

  // A worker that records its environment and arguments under its RANK.
  std::string envDumpScript() {
    return dir_.writeScript("dump_env", "env > \"" + dir_.path() + "/env.$RANK\"\n" +
                                            "for a in \"$@\"; do printf '%s\\n' \"$a\"; done > \"" + dir_.path() +
                                            "/args.$RANK\"\n");
  }

  LaunchResult run(std::vector<std::string> args, std::map<std::string, std::optional<std::string>> env = {}) {
    LaunchSpec spec;
    spec.args = std::move(args);
    spec.env = std::move(env);
    spec.outputDir = dir_.path();
    return runLauncher(spec);
  }

  ScratchDir dir_;
};

TEST_F(LaunchEnvTest, EachOfThreeWorkersSeesTheTorchrunContract) {
  const std::vector<std::string> workerArgs{"--nproc_per_node", "9", "-x", "a b", "", "--help"};
  std::vector<std::string> args{"--nproc_per_node", "3", envDumpScript()};
  args.insert(args.end(), workerArgs.begin(), workerArgs.end());
  const LaunchResult result = run(args, {{"OMP_NUM_THREADS", std::nullopt},
                                         {"DDP_TEST_INHERITED", "kept"},
                                         {"RANK", "99"}});
  ASSERT_EQ(result.code, 0) << result.err;

  constexpr int kNproc = 3;
  std::string masterPort;
  for (int rank = 0; rank < kNproc; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto env = parseEnvFile(dir_.file("env." + std::to_string(rank)));
    ASSERT_FALSE(env.empty());
    // nnodes 1, node_rank 0: RANK = 0 * nproc + local_rank, WORLD_SIZE = 1 * nproc.
    EXPECT_EQ(env.at("RANK"), std::to_string(rank));
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(env.at("WORLD_SIZE"), std::to_string(kNproc));
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), std::to_string(kNproc));
    EXPECT_EQ(env.at("GROUP_RANK"), "0");
    EXPECT_EQ(env.at("ROLE_RANK"), std::to_string(rank));
    EXPECT_EQ(env.at("ROLE_WORLD_SIZE"), std::to_string(kNproc));
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "0");
    EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");
    EXPECT_EQ(env.at("DDP_TEST_INHERITED"), "kept");
    if (rank == 0) masterPort = env.at("MASTER_PORT");
    EXPECT_EQ(env.at("MASTER_PORT"), masterPort);  // one port for the whole job
    EXPECT_EQ(splitLines(readFile(dir_.file("args." + std::to_string(rank)))), workerArgs);
  }
  const int port = std::stoi(masterPort);
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  EXPECT_NE(result.err.find("OMP_NUM_THREADS=1"), std::string::npos) << result.err;
}

TEST_F(LaunchEnvTest, MultiNodeRanksAndAPresetOmpNumThreads) {
  const LaunchResult result = run({"--nnodes=3", "--node-rank=2", "--nproc-per-node=2", "--master_addr", "10.9.8.7",
                                   envDumpScript()},
                                  {{"OMP_NUM_THREADS", "7"}, {"DDP_RDZV_TOKEN", "multi-node-job-token-0123"}});
  ASSERT_EQ(result.code, 0) << result.err;
  for (int local = 0; local < 2; ++local) {
    const int rank = 2 * 2 + local;  // node_rank * nproc + local_rank
    const auto env = parseEnvFile(dir_.file("env." + std::to_string(rank)));
    ASSERT_FALSE(env.empty()) << "no env file for rank " << rank;
    EXPECT_EQ(env.at("RANK"), std::to_string(rank));
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(local));
    EXPECT_EQ(env.at("WORLD_SIZE"), "6");
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "2");
    EXPECT_EQ(env.at("GROUP_RANK"), "2");
    EXPECT_EQ(env.at("MASTER_ADDR"), "10.9.8.7");
    EXPECT_EQ(env.at("MASTER_PORT"), "29500");  // multi-node default
    EXPECT_EQ(env.at("OMP_NUM_THREADS"), "7");
  }
  EXPECT_EQ(result.err.find("OMP_NUM_THREADS"), std::string::npos) << result.err;
}

// Issue 46 (1): a token file of raw bytes with a NUL among them is the workers' secret whole, as
// hex, not cut at the NUL (which left an empty token: authentication off).
TEST_F(LaunchEnvTest, ARawTokenFileWithANulByteIsUsedWhole) {
  std::string raw;
  for (int i = 0; i < 32; ++i) raw += static_cast<char>(i == 5 ? 0 : 0x80 + 3 * i);
  const std::string path = dir_.file("raw.token");
  {
    std::FILE* out = std::fopen(path.c_str(), "wb");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(std::fwrite(raw.data(), 1, raw.size(), out), raw.size());
    std::fclose(out);
  }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  std::string hex;
  for (const char c : raw) {
    char two[3];
    std::snprintf(two, sizeof two, "%02x", static_cast<unsigned char>(c));
    hex += two;
  }
  const LaunchResult result = run({"--nnodes=2", "--node_rank=1", "--nproc_per_node=1", "--master_addr=10.9.8.7",
                                   "--rdzv_token_file=" + path, envDumpScript()},
                                  {{"DDP_RDZV_TOKEN", std::nullopt}, {"DDP_RDZV_TOKEN_FILE", std::nullopt}});
  ASSERT_EQ(result.code, 0) << result.err;
  const auto env = parseEnvFile(dir_.file("env.1"));
  ASSERT_TRUE(env.count("DDP_RDZV_TOKEN")) << "no token in the worker's environment";
  EXPECT_EQ(env.at("DDP_RDZV_TOKEN"), hex);
}

TEST_F(LaunchEnvTest, SingleWorkerGetsNoOmpDefaultAndTheGivenPort) {
  const LaunchResult result = run({"--master-port=29533", envDumpScript()}, {{"OMP_NUM_THREADS", std::nullopt}});
  ASSERT_EQ(result.code, 0) << result.err;
  const auto env = parseEnvFile(dir_.file("env.0"));
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(env.at("MASTER_PORT"), "29533");
  EXPECT_EQ(env.at("WORLD_SIZE"), "1");
}

TEST_F(LaunchEnvTest, LegacyLocalRankArgumentOnlyWhenUseEnvIsOff) {
  for (const std::string flag : {"--use_env=false", "--no-use-env"}) {
    SCOPED_TRACE(flag);
    ASSERT_EQ(run({flag, "--nproc_per_node=2", envDumpScript(), "cfg.yaml"}).code, 0);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(splitLines(readFile(dir_.file("args." + std::to_string(rank)))),
                (std::vector<std::string>{"--local_rank=" + std::to_string(rank), "cfg.yaml"}));
      EXPECT_EQ(parseEnvFile(dir_.file("env." + std::to_string(rank))).at("LOCAL_RANK"), std::to_string(rank));
    }
  }
  ASSERT_EQ(run({"--nproc_per_node=2", envDumpScript(), "cfg.yaml"}).code, 0);
  EXPECT_EQ(splitLines(readFile(dir_.file("args.1"))), std::vector<std::string>{"cfg.yaml"});
}

TEST_F(LaunchEnvTest, OutputLinesCarryTheRankOnTheRightStream) {
  constexpr int kLines = 300;
  const std::string script = dir_.writeScript(
      "talk", "i=0\nwhile [ $i -lt " + std::to_string(kLines) +
                  " ]; do echo \"out $RANK $i\"; i=$((i+1)); done\n"
                  "echo \"err $RANK\" >&2\nprintf 'tail %s' \"$RANK\"\n");
  const LaunchResult result = run({"--nproc_per_node=2", script});
  ASSERT_EQ(result.code, 0) << result.err;

  const std::regex outLine(R"(\[rank (\d)\] out (\d) (\d+))");
  const std::regex tailLine(R"(\[rank (\d)\] tail (\d))");
  std::vector<int> next(2, 0);
  std::vector<bool> tail(2, false);
  for (const std::string& line : splitLines(result.out)) {
    std::smatch match;
    if (std::regex_match(line, match, tailLine)) {
      EXPECT_EQ(match[1], match[2]) << line;
      tail[std::stoi(match[1])] = true;
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, match, outLine)) << "unexpected stdout line: " << line;
    const int rank = std::stoi(match[1]);
    ASSERT_EQ(std::stoi(match[2]), rank) << line;
    EXPECT_EQ(std::stoi(match[3]), next[rank]++) << line;  // in order within a rank
  }
  EXPECT_EQ(next, std::vector<int>(2, kLines));
  EXPECT_EQ(tail, std::vector<bool>(2, true));
  EXPECT_NE(result.err.find("[rank 0] err 0\n"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("[rank 1] err 1\n"), std::string::npos) << result.err;
}

TEST_F(LaunchEnvTest, BadInputIsOneLineAndExitCodeTwoWithNothingStarted) {
  const std::string marker = dir_.writeScript("marker", "touch \"" + dir_.path() + "/started.$RANK\"");
  const std::string notExecutable = dir_.file("plain.txt");
  dir_.writeScript("plain.txt", "exit 0");
  ::chmod(notExecutable.c_str(), 0644);
  const std::vector<std::vector<std::string>> cases{
      {"--nproc_per_node=0", marker},
      {"--nproc-per-node", "two", marker},
      {"--nnodes=2", "--node_rank=2", marker},
      {"--nproc_per_node=2"},
      {"--nproc_per_node=2", dir_.file("missing-worker")},
      {"--nproc_per_node=2", notExecutable},
      {"--nproc_per_node=2", "--bogus", marker},
      {"--master_addr=192.0.2.1", marker},  // single node, but not an address of this host
  };
  for (const auto& args : cases) {
    std::string joined;
    for (const std::string& arg : args) joined += arg + " ";
    SCOPED_TRACE(joined);
    const LaunchResult result = run(args);
    EXPECT_EQ(result.code, 2);
    EXPECT_EQ(splitLines(result.err).size(), 1u) << result.err;
    EXPECT_EQ(result.err.rfind("ddp-launch: ", 0), 0u) << result.err;
    EXPECT_TRUE(result.out.empty()) << result.out;
    EXPECT_FALSE(fileExists(dir_.file("started.0")));
  }
}

TEST_F(LaunchEnvTest, HelpAndVersionExitZero) {
  const LaunchResult help = run({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--nproc_per_node"), std::string::npos);
  const LaunchResult version = run({"--version"});
  EXPECT_EQ(version.code, 0);
  EXPECT_EQ(version.out.rfind("ddp-launch ", 0), 0u) << version.out;
}

}  // namespace
}  // namespace ddp::launcher::testing
