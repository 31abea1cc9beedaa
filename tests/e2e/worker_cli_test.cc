// The worker as users meet it through ddp-launch: bad input is one clear line
// and a non-zero exit with nothing left behind; two jobs on one host coexist.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sched.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <map>

#include "tests/support/loopback.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

const std::string kConfig = std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml";

std::string tempDir() { return test::makeTempDir("cli"); }

test::CommandResult launch(int nproc, std::vector<std::string> workerArgs, int timeout = 120) {
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(nproc),
                                   DDP_WORKER_BIN};
  argv.insert(argv.end(), workerArgs.begin(), workerArgs.end());
  return test::runCommand(argv, timeout);
}

TEST(WorkerCli, TwoJobsAtOnceOnOneHostBothSucceed) {
  const std::string a = tempDir();
  const std::string b = tempDir();
  // Two jobs of each single-host backend: separate ports, separate shared-memory segments.
  auto jobA = std::async(std::launch::async, [&] {
    return launch(2, {kConfig, "output.dir=" + a, "train.epochs=2", "train.max_steps=40", "backend=gloo"});
  });
  auto jobB = std::async(std::launch::async, [&] {
    return launch(2, {kConfig, "output.dir=" + b, "train.epochs=2", "train.max_steps=40"});
  });
  const std::string c = tempDir();
  auto jobC = std::async(std::launch::async, [&] {
    return launch(2, {kConfig, "output.dir=" + c, "train.epochs=2", "train.max_steps=40"});
  });
  const auto ra = jobA.get();
  const auto rb = jobB.get();
  const auto rc = jobC.get();
  ASSERT_EQ(ra.exitCode, 0) << ra.output;
  ASSERT_EQ(rb.exitCode, 0) << rb.output;
  ASSERT_EQ(rc.exitCode, 0) << rc.output;
  for (const auto& dir : {a, b, c}) {
    const auto summary = nlohmann::json::parse(test::readFile(dir + "/summary.json"));
    EXPECT_EQ(summary["world_size"], 2);
    EXPECT_EQ(summary["steps"], 40);
    // backend: auto is shm for CPU ranks on one host.
    EXPECT_EQ(summary["backend"], dir == a ? "gloo" : "shm");
    std::filesystem::remove_all(dir);
  }
}

// Issue 14 (6): srun and mpirun do not set OMP_NUM_THREADS, so each of several ranks on a host
// would use every core. Two ranks started as srun starts them (its env, no launcher): each takes
// its share of the cores, and local rank 0 says so once.
TEST(WorkerCli, UnderSlurmEachLocalRankTakesItsShareOfTheCores) {
  const std::string dir = tempDir();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  const int cores = CPU_COUNT(&set);
  const int share = std::max(1, cores / 2);
  const uint16_t port = test::freePort();
  auto rank = [&](int r) {
    return "env -u OMP_NUM_THREADS -u RANK -u WORLD_SIZE -u LOCAL_RANK SLURM_PROCID=" + std::to_string(r) +
           " SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_NODEID=0 SLURM_LOCALID=" + std::to_string(r) +
           " SLURM_STEP_TASKS_PER_NODE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " +
           DDP_WORKER_BIN + " " + kConfig + " output.dir=" + dir + " train.max_steps=5";
  };
  const auto run = test::runCommand(
      {"/bin/sh", "-c", rank(0) + " & first=$!; " + rank(1) + "; second=$?; wait $first; [ $? = 0 ] && [ $second = 0 ]"},
      120);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const std::string line = "threads: " + std::to_string(share) + " per rank (" + std::to_string(cores) +
                           " cores / 2 ranks on this host; OMP_NUM_THREADS is unset under slurm)";
  const size_t first = run.output.find(line);
  EXPECT_NE(first, std::string::npos) << run.output;
  EXPECT_EQ(run.output.find(line, first + 1), std::string::npos) << "said more than once:\n" << run.output;
  std::filesystem::remove_all(dir);
}

TEST(WorkerCli, MetricsAndSummaryAreWritten) {
  const std::string dir = tempDir();
  const auto r = launch(2, {kConfig, "output.dir=" + dir, "train.max_steps=25", "train.log_every=5"});
  ASSERT_EQ(r.exitCode, 0) << r.output;
  std::istringstream lines(test::readFile(dir + "/metrics.jsonl"));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(lines, line);) {
    const auto record = nlohmann::json::parse(line);
    steps.push_back(record["step"].get<int64_t>());
    EXPECT_GT(record["samples_per_s"].get<double>(), 0);
    EXPECT_TRUE(std::isfinite(record["loss"].get<double>()));
    // Global samples: steps × per-rank batch (32) × 2 ranks.
    EXPECT_EQ(record["samples"].get<int64_t>(), steps.back() * 32 * 2);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 5, 10, 15, 20, 25}));
  const auto summary = nlohmann::json::parse(test::readFile(dir + "/summary.json"));
  EXPECT_EQ(summary["samples"], 25 * 32 * 2);
  EXPECT_EQ(summary["test_total"], 512);
  EXPECT_TRUE(std::filesystem::exists(summary["export_path"].get<std::string>()));
  EXPECT_TRUE(std::filesystem::exists(dir + "/config.resolved.yaml"));
  std::filesystem::remove_all(dir);
}

// A config error that only the data or the step plan reveals (here a decay that ends in the warm-up)
// comes after the output directory is known: the refused run must leave the finished run's
// metrics, resolved config and summary there as they were (it truncated metrics.jsonl and
// rewrote config.resolved.yaml). Checked for a DDP job and for mode dp.
TEST(WorkerCli, ALateConfigErrorLeavesAFinishedRunsOutputsAsTheyWere) {
  const std::string dir = tempDir();
  ASSERT_EQ(launch(2, {kConfig, "output.dir=" + dir, "train.max_steps=10", "train.log_every=5"}).exitCode, 0);
  std::map<std::string, std::string> before;
  for (const char* name : {"metrics.jsonl", "config.resolved.yaml", "summary.json"}) {
    before[name] = test::readFile(dir + "/" + name);
    ASSERT_FALSE(before[name].empty()) << name;
  }
  for (const std::string& mode : {"ddp", "dp"}) {
    const auto refused = launch(mode == "dp" ? 1 : 2, {kConfig, "output.dir=" + dir, "mode=" + mode,
                                                       "train.lr_schedule=cosine", "train.warmup_steps=10",
                                                       "train.decay_steps=5", "train.max_steps=5"});
    EXPECT_EQ(refused.exitCode, 2) << refused.output;
    EXPECT_NE(refused.output.find("'train.warmup_steps' is 10 but train.decay_steps is 5"), std::string::npos)
        << refused.output;
    for (const auto& [name, bytes] : before) EXPECT_EQ(test::readFile(dir + "/" + name), bytes) << mode << " " << name;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
