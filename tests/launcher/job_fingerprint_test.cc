// What the nodes of an elastic job compare on arrival (launcher/job_fingerprint.h).
#include "launcher/job_fingerprint.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher {
namespace {

LaunchOptions optionsWith(const std::string& worker, std::vector<std::string> args) {
  LaunchOptions options;
  options.nprocPerNode = 2;
  options.elastic.enabled = true;
  options.elastic.minNodes = 1;
  options.elastic.maxNodes = 3;
  options.worker = worker;
  options.workerArgs = std::move(args);
  return options;
}

TEST(JobFingerprint, TheSameFileAtAnotherPathAgreesAndAnotherContentDoesNot) {
  testing::ScratchDir dir;
  std::ofstream(dir.file("a.yaml")) << "lr: 0.1\n";
  std::ofstream(dir.file("b.yaml")) << "lr: 0.1\n";
  std::ofstream(dir.file("c.yaml")) << "lr: 0.2\n";
  const JobFingerprint job = fingerprintOf(optionsWith("/opt/bin/worker", {dir.file("a.yaml"), "seed=1"}));
  // What the store keeps reads back the same.
  EXPECT_EQ(JobFingerprint::parse(job.text()).items, job.items);
  EXPECT_EQ(firstDifference(job, fingerprintOf(optionsWith("./worker", {dir.file("b.yaml"), "seed=1"}))), std::nullopt);
  const auto content = firstDifference(job, fingerprintOf(optionsWith("./worker", {dir.file("c.yaml"), "seed=1"})));
  ASSERT_TRUE(content.has_value());
  EXPECT_EQ(content->rfind("worker argument 1 is a file (sha256 ", 0), 0u) << *content;
  const auto seed = firstDifference(job, fingerprintOf(optionsWith("./worker", {dir.file("a.yaml"), "seed=2"})));
  EXPECT_EQ(seed, "worker argument 2 is 'seed=2' here but 'seed=1' in the job");
  const auto fewer = firstDifference(job, fingerprintOf(optionsWith("./worker", {dir.file("a.yaml")})));
  EXPECT_EQ(fewer, "the number of worker arguments is '1' here but '2' in the job");
  const auto program = firstDifference(job, fingerprintOf(optionsWith("./other", {dir.file("a.yaml"), "seed=1"})));
  EXPECT_EQ(program, "the worker is 'other' here but 'worker' in the job");
}

TEST(JobFingerprint, LauncherFlagsAreCompared) {
  const JobFingerprint job = fingerprintOf(optionsWith("w", {}));
  LaunchOptions nproc = optionsWith("w", {});
  nproc.nprocPerNode = 4;
  EXPECT_EQ(firstDifference(job, fingerprintOf(nproc)), "--nproc_per_node is '4' here but '2' in the job");
  LaunchOptions nnodes = optionsWith("w", {});
  nnodes.elastic.maxNodes = 4;
  EXPECT_EQ(firstDifference(job, fingerprintOf(nnodes)), "--nnodes is '1:4' here but '1:3' in the job");
  LaunchOptions restarts = optionsWith("w", {});
  restarts.maxRestarts = 2;
  EXPECT_EQ(firstDifference(job, fingerprintOf(restarts)), "--max_restarts is '2' here but '0' in the job");
  // A job record without an item this launcher compares (another version wrote it).
  EXPECT_NE(firstDifference(JobFingerprint::parse("--nproc_per_node\t2\n"), job), std::nullopt);
}

}  // namespace
}  // namespace ddp::launcher
