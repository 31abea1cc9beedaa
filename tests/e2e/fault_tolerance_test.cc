// Fault tolerance through the real programs: a crashed rank makes the launcher
// restart the group and training resumes exactly; a rank that stops answering
// makes the others fail within comm.timeout_s and the launcher names it; and a
// two-node job across two network namespaces (skipped where they cannot be made).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <ATen/ops/equal.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <sstream>
#include <fstream>
#include <random>
#include <thread>

#include "tests/support/e2e_models.h"
#include "tests/support/run_command.h"
#include "ddp/state_dict.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
const std::string kConfig = std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml";

std::string tempDir() { return test::makeTempDir("fault"); }

/// A background launch whose output goes to a file we can watch.
using test::Background;

using test::childrenOf;  // the worker processes the launcher started, by rank order of start

std::vector<std::string> trainArgs(const std::string& out) {
  return {kConfig, "seed=9", "model.hidden=[32]", "data.synthetic_train=256", "data.synthetic_test=64",
          "train.batch_size=8", "train.epochs=1000", "train.log_every=1", "train.max_steps=40",
          "output.dir=" + out, "output.dump_rank_params=true", "checkpoint.every_steps=5",
          "checkpoint.keep_last=2", "resume=auto"};
}

TEST(FaultTolerance, CrashedRankRestartsTheGroupAndTrainingResumesExactly) {
  const std::string base = tempDir();
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=2", "--max_restarts=1",
                                   "--shutdown_grace_s=2", DDP_WORKER_BIN};
  for (auto& a : trainArgs(base + "/crashed")) argv.push_back(a);
  // A random rank at a random step (logged, so a failure can be replayed).
  std::random_device entropy;
  std::mt19937 rng(entropy());
  const int victim = static_cast<int>(rng() % 2);
  const int atStep = 6 + static_cast<int>(rng() % 25);
  std::cout << "killing rank " << victim << " at step " << atStep << std::endl;
  Background job(argv, base + "/crashed.log");
  ASSERT_TRUE(job.waitFor("step " + std::to_string(atStep) + "/", 120)) << test::readFile(job.log);
  const auto workers = childrenOf(job.pid);
  ASSERT_EQ(workers.size(), 2u);
  ::kill(workers[victim], SIGKILL);  // e.g. the OOM killer
  EXPECT_EQ(job.wait(240), 0) << test::readFile(job.log);
  const std::string output = test::readFile(job.log);
  EXPECT_NE(output.find("restarting the group (restart 1/1)"), std::string::npos) << output;
  EXPECT_NE(output.find("resumed from"), std::string::npos) << output;

  const auto straight = test::runCommand([&] {
    std::vector<std::string> a = {DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN};
    for (auto& x : trainArgs(base + "/straight")) a.push_back(x);
    return a;
  }(), 240);
  ASSERT_EQ(straight.exitCode, 0) << straight.output;
  test::expectRankParamsBitwiseEqual(base + "/straight", base + "/crashed", 2);
  fs::remove_all(base);
}

struct StuckCase {
  std::string backend;
  int ranks;
  int stopped;  // the rank that gets SIGSTOP
};

std::ostream& operator<<(std::ostream& out, const StuckCase& c) {
  return out << c.backend << "_" << c.ranks << "_ranks_stop_" << c.stopped;
}

class StuckRank : public ::testing::TestWithParam<StuckCase> {};

TEST_P(StuckRank, TheOthersFailWithinTheTimeoutAndNameIt) {
  const StuckCase c = GetParam();
  const std::string base = tempDir();
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(c.ranks), "--shutdown_grace_s=1",
                                   DDP_WORKER_BIN};
  for (auto& a : trainArgs(base + "/out")) argv.push_back(a);
  argv.push_back("train.max_steps=100000");
  argv.push_back("comm.timeout_s=3");
  argv.push_back("backend=" + c.backend);
  Background job(argv, base + "/job.log");
  ASSERT_TRUE(job.waitFor("step 10/", 120)) << test::readFile(job.log);
  const auto workers = childrenOf(job.pid);
  ASSERT_EQ(workers.size(), static_cast<size_t>(c.ranks));
  const auto stoppedAt = std::chrono::steady_clock::now();
  ::kill(workers[c.stopped], SIGSTOP);  // alive but silent: the hang torchrun users know
  const int code = job.wait(60);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stoppedAt).count();
  const std::string output = test::readFile(job.log);
  EXPECT_NE(code, 0) << output;
  EXPECT_NE(code, -1) << "the job hung: " << output;
  EXPECT_LT(seconds, 3 + 3 + 1 + 10) << output;  // timeout + the survivors' census + grace + slack
  EXPECT_NE(output.find("timed out"), std::string::npos) << output;
  // The workers name the rank that did not join the collective...
  EXPECT_NE(output.find("(missing: " + std::to_string(c.stopped) + "); that rank stopped answering"), std::string::npos)
      << output;
  // ...and the launcher's summary names it too, seen in state T.
  EXPECT_NE(output.find("rank " + std::to_string(c.stopped) + " was stopped (state T) when rank "), std::string::npos)
      << output;
  EXPECT_NE(output.find("stopped by the launcher"), std::string::npos) << output;
  EXPECT_EQ(::kill(workers[c.stopped], 0), -1) << "the stuck worker survived";
  fs::remove_all(base);
}

INSTANTIATE_TEST_SUITE_P(FaultTolerance, StuckRank,
                         ::testing::Values(StuckCase{"shm", 2, 1}, StuckCase{"gloo", 2, 1}, StuckCase{"shm", 4, 2},
                                           StuckCase{"gloo", 4, 2}),
                         [](const auto& info) {
                           std::ostringstream name;
                           name << info.param;
                           return name.str();
                         });

bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// A /dev/shm too small for the shm backend's segment (issue 30, 4): one line with the sizes, not
// a SIGBUS at the first collective (ftruncate never fails on tmpfs; the pages came on first touch).
// The job runs in a mount namespace of its own whose /dev/shm is an 8 MiB tmpfs.
TEST(FaultTolerance, ADevShmTooSmallForTheShmBackendIsOneLineNotASigbus) {
  if (::geteuid() != 0 || !sh("unshare -m true")) GTEST_SKIP() << "needs root and unshare -m";
  const std::string base = tempDir();
  std::string job = std::string(DDP_LAUNCH_BIN) + " --nproc_per_node=2 " + DDP_WORKER_BIN;
  for (const auto& a : trainArgs(base + "/out")) job += " '" + a + "'";
  job += " backend=shm 'model.hidden=[2048, 2048]' train.max_steps=3";
  const auto r = test::runCommand(
      {"/usr/bin/unshare", "-m", "/bin/sh", "-c", "mount -t tmpfs -o size=8m tmpfs /dev/shm && exec " + job}, 120);
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find(" MiB segment in /dev/shm (No space left on device; /dev/shm has "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("enlarge it (docker run --shm-size) or use backend: gloo"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("SIGBUS"), std::string::npos) << r.output;
  fs::remove_all(base);
}

// A file system out of inodes (issue 30): the start-up probe says so, with the errno's text, before
// any training (a tmpfs with nr_inodes=2 in a mount namespace: the output directory takes one).
TEST(FaultTolerance, AnOutputDirWithoutInodesIsOneLineAtStartUp) {
  if (::geteuid() != 0 || !sh("unshare -m true")) GTEST_SKIP() << "needs root and unshare -m";
  const std::string base = tempDir();
  const std::string mnt = base + "/ino";
  fs::create_directories(mnt);
  std::string job = std::string(DDP_LAUNCH_BIN) + " --nproc_per_node=1 " + DDP_WORKER_BIN + " " + kConfig +
                    " train.max_steps=3 output.dir=" + mnt + "/out";
  const auto r = test::runCommand(
      {"/usr/bin/unshare", "-m", "/bin/sh", "-c",
       "mount -t tmpfs -o size=20m,nr_inodes=2 tmpfs " + mnt + " && exec " + job}, 120);
  EXPECT_EQ(r.exitCode, 2) << r.output;
  EXPECT_NE(r.output.find("config: 'output.dir': cannot create 'summary.json' in '" + mnt +
                          "/out' (No space left on device); free space or inodes (df -i)"),
            std::string::npos)
      << r.output;
  fs::remove_all(base);
}

TEST(FaultTolerance, TwoNodesInTwoNetworkNamespaces) {
  const std::string tag = "ddpt" + std::to_string(::getpid() % 100000);
  const std::string a = tag + "a", b = tag + "b";
  if (::geteuid() != 0 || !sh("ip netns add " + a)) GTEST_SKIP() << "needs root and ip netns";
  sh("ip netns add " + b);
  const bool ok = sh("ip link add " + tag + "x netns " + a + " type veth peer name " + tag + "y netns " + b) &&
                  sh("ip -n " + a + " addr add 10.231.77.1/24 dev " + tag + "x") &&
                  sh("ip -n " + b + " addr add 10.231.77.2/24 dev " + tag + "y") &&
                  sh("ip -n " + a + " link set " + tag + "x up") && sh("ip -n " + b + " link set " + tag + "y up") &&
                  sh("ip -n " + a + " link set lo up") && sh("ip -n " + b + " link set lo up");
  struct Cleanup {
    std::string a, b;
    ~Cleanup() { sh("ip netns del " + a); sh("ip netns del " + b); }
  } cleanup{a, b};
  if (!ok) GTEST_SKIP() << "could not wire the namespaces";

  const std::string base = tempDir();
  // The nodes share the job's token through a file, as on a shared file system.
  const std::string token = base + "/job.token";
  std::ofstream(token) << "two-namespaces-job-token-42\n";
  ::chmod(token.c_str(), 0600);
  auto node = [&](int rank, const std::string& ns) {
    std::vector<std::string> argv = {"/usr/bin/ip", "netns", "exec", ns, DDP_LAUNCH_BIN, "--nnodes=2",
                                     "--node_rank=" + std::to_string(rank), "--nproc_per_node=2",
                                     "--master_addr=10.231.77.1", "--master_port=29631",
                                     "--rdzv_token_file=" + token, DDP_WORKER_BIN};
    // One output dir for both nodes, as on a shared file system: every rank must resolve the same
    // config (the worker checks), and ranks write distinct per-rank files.
    for (auto& x : trainArgs(base + "/out")) argv.push_back(x);
    argv.push_back("train.max_steps=12");
    argv.push_back("comm.timeout_s=60");
    return argv;
  };
  Background node0(node(0, a), base + "/node0.log");
  Background node1(node(1, b), base + "/node1.log");
  EXPECT_EQ(node0.wait(180), 0) << test::readFile(node0.log);
  EXPECT_EQ(node1.wait(180), 0) << test::readFile(node1.log);
  const auto summary = nlohmann::json::parse(test::readFile(base + "/out/summary.json"));
  EXPECT_EQ(summary["world_size"], 4);
  EXPECT_EQ(summary["steps"], 12);
  // Ranks 0,1 on node 0 and 2,3 on node 1 end with the same parameters.
  const auto r0 = ddp::loadTensors(base + "/out/rank0_params.pt");
  for (int rank : {1, 2, 3}) {
    const auto other = ddp::loadTensors(base + "/out/rank" + std::to_string(rank) + "_params.pt");
    for (const auto& [key, value] : r0) EXPECT_TRUE(at::equal(value, other.at(key))) << "rank " << rank << " " << key;
  }
  fs::remove_all(base);
}

}  // namespace
}  // namespace ddp
