// Elastic jobs (--nnodes=MIN:MAX): several real launchers on this machine, each its own process
// tree ("node"), one of them hosting the rendezvous; nodes are SIGKILLed, leave on SIGTERM and
// join while the job runs, and the training goes on at the new world size.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/loopback.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

const std::string kConfig = std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml";

struct Job {
  std::string base = test::makeTempDir("elastic");
  std::string token = base + "/token";
  uint16_t port = test::freePort();

  Job() {
    std::ofstream(token) << "0123456789abcdef0123456789abcdef";
    ::chmod(token.c_str(), 0600);
  }
  ~Job() { fs::remove_all(base); }

  // One node's launcher: 2 workers, short timeouts so a lost node is noticed in 3 s.
  std::vector<std::string> node(const std::string& nnodes, std::vector<std::string> extra = {},
                                std::vector<std::string> worker = {}) const {
    std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nnodes=" + nnodes, "--nproc_per_node=2",
                                     "--master_port=" + std::to_string(port), "--rdzv_token_file=" + token,
                                     "--rdzv_last_call_s=1", "--heartbeat_timeout_s=3", "--shutdown_grace_s=2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(DDP_WORKER_BIN);
    argv.push_back(kConfig);
    if (worker.empty()) worker = training();
    argv.insert(argv.end(), worker.begin(), worker.end());
    return argv;
  }

  // Long enough that a node can join while it runs; every sample once per epoch (join: no padding).
  std::vector<std::string> training() const {
    return {"seed=3", "model.hidden=[512,512]", "data.synthetic_train=" + std::to_string(kSamples),
            "data.synthetic_test=64", "train.batch_size=8", "train.epochs=4", "train.log_every=10",
            "train.uneven_inputs=join", "eval.enabled=false", "output.sample_log=true",
            "output.dir=" + base + "/out", "checkpoint.dir=" + base + "/ckpt", "checkpoint.every_steps=5",
            "resume=auto"};
  }

  static constexpr int64_t kSamples = 4096;
};

using test::childrenOf;

bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// Waits until `text` appears in `job`'s log after `marker`.
bool waitForAfter(const test::Background& job, const std::string& marker, const std::string& text, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string log = test::readFile(job.log);
    const size_t at = log.find(marker);
    if (at != std::string::npos && log.find(text, at) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a polling interval, not synchronisation
  }
  return false;
}

bool waitForFile(const std::string& path, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a polling interval
  }
  return true;
}

// One batch line of output.sample_log and the run (round) that wrote it.
struct Batch {
  int round;
  int64_t epoch, step;
  std::vector<int64_t> indices;
};

std::vector<Batch> readSampleLogs(const std::string& dir) {
  std::vector<Batch> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("samples_rank", 0) != 0) continue;
    std::ifstream in(entry.path());
    int round = -1;
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      if (line.rfind("# restart ", 0) == 0) {
        std::string hash, word;
        fields >> hash >> word >> round;
        continue;
      }
      Batch batch{round, 0, 0, {}};
      fields >> batch.epoch >> batch.step;
      for (int64_t i; fields >> i;) batch.indices.push_back(i);
      out.push_back(batch);
    }
  }
  return out;
}

TEST(Elastic, ANodeDiesAnotherJoinsAndEveryEpochSeesEverySampleOnce) {
  const Job job;
  test::Background a(job.node("1:2", {"--max_restarts=3"}), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.node("1:2", {"--max_restarts=3"}), job.base + "/b.log");
  // Round 0 runs on both nodes (world 4); node 1's launcher dies mid-epoch with its workers.
  ASSERT_TRUE(a.waitFor("step 20/", 120)) << test::readFile(a.log) << test::readFile(b.log);
  ASSERT_EQ(test::readFile(a.log).find("round 1:"), std::string::npos) << test::readFile(a.log);
  ::kill(b.pid, SIGKILL);
  ASSERT_EQ(b.wait(30), 128 + SIGKILL);
  // Node 0 goes on alone (world 2); a new node joins while it trains and is admitted.
  ASSERT_TRUE(a.waitFor("round 1:", 120)) << test::readFile(a.log);
  // ... once it trains at world 2 (a join before its first step would leave round 1 empty).
  ASSERT_TRUE(waitForAfter(a, "round 1:", "info epoch ", 120)) << test::readFile(a.log);
  test::Background c(job.node("1:2", {"--max_restarts=3"}), job.base + "/c.log");
  EXPECT_EQ(a.wait(300), 0) << test::readFile(a.log);
  EXPECT_EQ(c.wait(120), 0) << test::readFile(c.log);
  const std::string logA = test::readFile(a.log);
  EXPECT_NE(logA.find("round 0: nodes 0,1 (world 4)"), std::string::npos) << logA;
  EXPECT_NE(logA.find("round 1: nodes 0 (world 2), node 1 left (no heartbeat for 3 s)"), std::string::npos) << logA;
  EXPECT_NE(logA.find("round 1 ended: a node is waiting to join"), std::string::npos) << logA;
  EXPECT_NE(logA.find("round 2: nodes 0,2 (world 4), node 2 joined"), std::string::npos) << logA;
  EXPECT_NE(test::readFile(c.log).find("round 2: nodes 0,2 (world 4)"), std::string::npos) << test::readFile(c.log);
  // The join was admitted at a checkpoint the workers agreed on: round 2 resumed where round 1 stopped.
  EXPECT_NE(logA.find("stopping after step"), std::string::npos) << logA;

  // A round redoes the steps after the checkpoint it resumed from: a batch of round r counts
  // unless a later round started at or before its step.
  const std::vector<Batch> batches = readSampleLogs(job.base + "/out");
  std::map<int, int64_t> firstStep;  // round → its first step
  for (const Batch& batch : batches) {
    ASSERT_GE(batch.round, 0) << "a sample-log line before any '# restart' header";
    auto [it, fresh] = firstStep.emplace(batch.round, batch.step);
    if (!fresh) it->second = std::min(it->second, batch.step);
  }
  ASSERT_EQ(firstStep.size(), 3u) << "rounds that trained";
  std::map<int64_t, std::vector<int64_t>> seen;  // epoch → indices
  std::set<int64_t> steps;
  for (const Batch& batch : batches) {
    bool redone = false;
    for (const auto& [round, first] : firstStep) redone = redone || (round > batch.round && first <= batch.step);
    if (redone) continue;
    steps.insert(batch.step);
    seen[batch.epoch].insert(seen[batch.epoch].end(), batch.indices.begin(), batch.indices.end());
  }
  ASSERT_EQ(seen.size(), 4u);
  std::vector<int64_t> everyIndex(Job::kSamples);
  for (int64_t i = 0; i < Job::kSamples; ++i) everyIndex[static_cast<size_t>(i)] = i;
  for (auto& [epoch, indices] : seen) {
    std::sort(indices.begin(), indices.end());
    EXPECT_EQ(indices, everyIndex) << "epoch " << epoch << ": " << indices.size() << " samples seen";
  }
  // The steps continue from the step reached: 1 .. the job's last, each once.
  const auto summary = nlohmann::json::parse(test::readFile(job.base + "/out/summary.json"));
  const int64_t last = summary["steps"].get<int64_t>();
  EXPECT_EQ(static_cast<int64_t>(steps.size()), last);
  EXPECT_EQ(*steps.begin(), 1);
  EXPECT_EQ(*steps.rbegin(), last);
}

TEST(Elastic, RunningNodesKeepTheirPlacesAndANodeThatFindsNoRoomEndsWhenTheJobFinishes) {
  // MAX 3: two nodes run, two more arrive; the running ones stop their workers at a checkpoint
  // and keep their places (newcomers are quicker to the next round), one newcomer fills the third,
  // the other waits for room until the job finishes, and then ends with 0.
  const Job job;
  std::vector<std::string> training = job.training();
  training.push_back("train.max_steps=120");
  test::Background a(job.node("1:3", {}, training), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.node("1:3", {}, training), job.base + "/b.log");
  ASSERT_TRUE(a.waitFor("round 0: nodes 0,1 (world 4)", 60)) << test::readFile(a.log);
  ASSERT_TRUE(waitForAfter(a, "round 0:", "info epoch ", 120)) << test::readFile(a.log);
  test::Background c(job.node("1:3", {}, training), job.base + "/c.log");
  test::Background d(job.node("1:3", {}, training), job.base + "/d.log");
  EXPECT_EQ(a.wait(300), 0) << test::readFile(a.log);
  EXPECT_EQ(b.wait(60), 0) << test::readFile(b.log);
  EXPECT_EQ(c.wait(60), 0) << test::readFile(c.log);
  EXPECT_EQ(d.wait(60), 0) << test::readFile(d.log);
  const std::string logA = test::readFile(a.log);
  EXPECT_NE(logA.find("round 1: nodes 0,1,"), std::string::npos) << logA;
  EXPECT_NE(logA.find("(world 6)"), std::string::npos) << logA;
  const std::string logs = test::readFile(c.log) + test::readFile(d.log);
  EXPECT_NE(logs.find("the job finished before this node was admitted"), std::string::npos) << logs;
  EXPECT_EQ(logA.find(" left ("), std::string::npos) << logA;  // nobody was pushed out
}

TEST(Elastic, ANodeThatGetsSigtermLeavesAndTheOthersGoOnAtOnce) {
  const Job job;
  test::Background a(job.node("1:2", {"--max_restarts=1"}), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.node("1:2", {"--max_restarts=1"}), job.base + "/b.log");
  ASSERT_TRUE(a.waitFor("step 20/", 120)) << test::readFile(a.log) << test::readFile(b.log);
  ::kill(b.pid, SIGTERM);  // e.g. the node is drained
  EXPECT_EQ(b.wait(60), 128 + SIGTERM) << test::readFile(b.log);
  EXPECT_EQ(a.wait(300), 0) << test::readFile(a.log);
  const std::string logA = test::readFile(a.log);
  EXPECT_NE(logA.find("round 1: nodes 0 (world 2), node 1 left (its launcher received SIGTERM)"), std::string::npos)
      << logA;
}

TEST(Elastic, AFailureBeyondMaxRestartsEndsTheJobOnEveryNode) {
  const Job job;
  test::Background a(job.node("1:2", {"--max_restarts=1"}), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.node("1:2", {"--max_restarts=1"}), job.base + "/b.log");
  // Failure 1: one of node 1's workers dies; both nodes restart (round 1, restart 1/1).
  ASSERT_TRUE(a.waitFor("step 20/", 120)) << test::readFile(a.log);
  std::vector<pid_t> workers = childrenOf(b.pid);
  ASSERT_EQ(workers.size(), 2u);
  ::kill(workers[1], SIGKILL);
  ASSERT_TRUE(waitForAfter(a, "round 1:", "info epoch ", 120)) << test::readFile(a.log);
  // Failure 2, counted on from round 1's end: the job ends on both nodes.
  workers = childrenOf(b.pid);
  ASSERT_EQ(workers.size(), 2u);
  ::kill(workers[0], SIGKILL);
  EXPECT_NE(a.wait(120), 0) << test::readFile(a.log);
  EXPECT_EQ(b.wait(60), 128 + SIGKILL) << test::readFile(b.log);  // its own worker's end
  for (const std::string& log : {test::readFile(a.log), test::readFile(b.log)}) {
    EXPECT_NE(log.find("restarting with the nodes still there (restart 1/1)"), std::string::npos) << log;
    EXPECT_NE(log.find("was failure 2 and --max_restarts=1"), std::string::npos) << log;
    EXPECT_EQ(log.find("round 2:"), std::string::npos) << log;
  }
}

TEST(Elastic, TheJobSurvivesLosingTheHostingNodesWorkers) {
  // The store lives in the launcher, not in rank 0: a crashed worker of node 0 is a failure like
  // any other, and the next round has both nodes again.
  const Job job;
  test::Background a(job.node("1:2", {"--max_restarts=1"}), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.node("1:2", {"--max_restarts=1"}), job.base + "/b.log");
  ASSERT_TRUE(a.waitFor("step 20/", 120)) << test::readFile(a.log) << test::readFile(b.log);
  const std::vector<pid_t> workers = childrenOf(a.pid);
  ASSERT_EQ(workers.size(), 2u);
  ::kill(workers[0], SIGKILL);  // the first started: rank 0, which hosts the workers' own store
  EXPECT_EQ(a.wait(300), 0) << test::readFile(a.log);
  EXPECT_EQ(b.wait(60), 0) << test::readFile(b.log);
  const std::string logA = test::readFile(a.log);
  // Node 0 names its own rank's death: as the round's end reason, or, when node 1's report (its
  // ranks lost their peer) reached the rendezvous first, on a line of its own after it.
  size_t ended = logA.find("round 0 ended: node 0: rank ");
  if (ended == std::string::npos) ended = logA.find("round 0: here too, node 0: rank ");
  ASSERT_NE(ended, std::string::npos) << logA;
  const std::string line = logA.substr(ended, logA.find('\n', ended) - ended);
  EXPECT_NE(line.find("was killed by SIGKILL"), std::string::npos) << line;
  std::cout << "node 0 said: " << line << std::endl;
  EXPECT_NE(logA.find("round 1: nodes 0,1 (world 4)"), std::string::npos) << logA;
  EXPECT_NE(logA.find("restart 1/1"), std::string::npos) << logA;
}

TEST(Elastic, TheHostingLauncherDyingEndsTheOthersWithOneLineAndNoWorkerLeft) {
  const Job job;
  test::Background a(job.node("1:2"), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.node("1:2"), job.base + "/b.log");
  ASSERT_TRUE(b.waitFor("round 0: nodes 0,1 (world 4)", 60)) << test::readFile(b.log);
  ASSERT_TRUE(a.waitFor("step 20/", 120)) << test::readFile(a.log);
  std::vector<pid_t> workers = childrenOf(a.pid);
  const std::vector<pid_t> workersB = childrenOf(b.pid);
  workers.insert(workers.end(), workersB.begin(), workersB.end());
  ASSERT_EQ(workers.size(), 4u);
  ::kill(a.pid, SIGKILL);
  ASSERT_EQ(a.wait(30), 128 + SIGKILL);
  EXPECT_EQ(b.wait(60), 1) << test::readFile(b.log);
  const std::string logB = test::readFile(b.log);
  EXPECT_NE(logB.find("hosted by another node's launcher) stopped answering"), std::string::npos) << logB;
  for (pid_t worker : workers) EXPECT_FALSE(alive(worker)) << "worker " << worker << " outlived its job";
}

TEST(Elastic, FewerThanMinNodesAfterTheRendezvousTimeoutIsOneLine) {
  const Job job;
  const auto run = test::runCommand(job.node("2:3", {"--rdzv_timeout_s=2"}), 60);
  EXPECT_EQ(run.exitCode, 1) << run.output;
  EXPECT_NE(run.output.find("rendezvous round 0 has 1 of the at least 2 nodes it needs (nodes 0) after "
                            "--rdzv_timeout_s=2 s; the job ends"),
            std::string::npos)
      << run.output;
}

TEST(Elastic, AWorkersBadConfigurationEndsTheJobOnEveryNode) {
  const Job job;
  std::vector<std::string> bad = job.training();
  bad.push_back("train.optimizer=nonsense");
  test::Background a(job.node("2:2", {"--max_restarts=3"}, bad), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.node("2:2", {"--max_restarts=3"}, bad), job.base + "/b.log");
  EXPECT_EQ(a.wait(120), 2) << test::readFile(a.log);
  EXPECT_EQ(b.wait(120), 2) << test::readFile(b.log);
  EXPECT_NE(test::readFile(a.log).find("which every restart would repeat"), std::string::npos) << test::readFile(a.log);
  EXPECT_EQ(test::readFile(a.log).find("round 1:"), std::string::npos) << test::readFile(a.log);
}

bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

TEST(Elastic, TwoNodesInTwoNetworkNamespacesMeetAtTheHostsAddress) {
  // Real addresses: each node's launcher tells the others where it is from its connection to the
  // rendezvous, and the round's node 0 publishes rank 0's store there.
  const std::string tag = "ddpe" + std::to_string(::getpid() % 100000);
  const std::string a = tag + "a", b = tag + "b";
  if (::geteuid() != 0 || !sh("ip netns add " + a)) GTEST_SKIP() << "needs root and ip netns";
  sh("ip netns add " + b);
  struct Cleanup {
    std::string a, b;
    ~Cleanup() {
      sh("ip netns del " + a);
      sh("ip netns del " + b);
    }
  } cleanup{a, b};
  const bool ok = sh("ip link add " + tag + "x netns " + a + " type veth peer name " + tag + "y netns " + b) &&
                  sh("ip -n " + a + " addr add 10.231.78.1/24 dev " + tag + "x") &&
                  sh("ip -n " + b + " addr add 10.231.78.2/24 dev " + tag + "y") &&
                  sh("ip -n " + a + " link set " + tag + "x up") && sh("ip -n " + b + " link set " + tag + "y up") &&
                  sh("ip -n " + a + " link set lo up") && sh("ip -n " + b + " link set lo up");
  if (!ok) GTEST_SKIP() << "could not wire the namespaces";
  const Job job;
  auto node = [&](const std::string& ns) {
    std::vector<std::string> argv = job.node("2:2", {"--master_addr=10.231.78.1"},
                                             {"seed=3", "data.synthetic_train=256", "data.synthetic_test=64",
                                              "train.batch_size=8", "train.epochs=3", "train.max_steps=12", "eval.enabled=false",
                                              "output.dir=" + job.base + "/out"});
    argv.insert(argv.begin(), {"/usr/bin/ip", "netns", "exec", ns});
    return argv;
  };
  test::Background node0(node(a), job.base + "/a.log");
  ASSERT_TRUE(node0.waitFor("this is node 0", 60)) << test::readFile(node0.log);
  test::Background node1(node(b), job.base + "/b.log");
  EXPECT_EQ(node0.wait(180), 0) << test::readFile(node0.log);
  EXPECT_EQ(node1.wait(180), 0) << test::readFile(node1.log);
  const std::string log0 = test::readFile(node0.log), log1 = test::readFile(node1.log);
  EXPECT_NE(log0.find("this is node 0 at 10.231.78.1; hosting the rendezvous at 10.231.78.1:"), std::string::npos)
      << log0;
  EXPECT_NE(log1.find("this is node 1 at 10.231.78.2; joined the rendezvous at 10.231.78.1:"), std::string::npos)
      << log1;
  EXPECT_NE(log1.find("round 0: nodes 0,1 (world 4)"), std::string::npos) << log1;
  const auto summary = nlohmann::json::parse(test::readFile(job.base + "/out/summary.json"));
  EXPECT_EQ(summary["world_size"], 4);
  EXPECT_EQ(summary["steps"], 12);
}

// Nodes whose workers are a shell script: each rank publishes its pid, then waits until the test
// creates `finish` (exit 0) or `fail.<RANK>` (exit 1). No training: these tests are about the
// launchers, and run in seconds.
struct ScriptJob : Job {
  std::string script = base + "/rank.sh";
  ScriptJob() {
    std::ofstream(script) << "#!/bin/sh\n"
                          << "echo $$ > '" << base << "/pid.'$GROUP_RANK.$LOCAL_RANK\n"
                          << "while :; do\n"
                          << "  [ -e '" << base << "/fail.'$RANK ] && exit 1\n"
                          << "  [ -e '" << base << "/finish' ] && exit 0\n"
                          << "  sleep 0.05\n"  // a polling interval, not synchronisation
                          << "done\n";
    ::chmod(script.c_str(), 0755);
  }
  std::vector<std::string> scriptNode(const std::string& nnodes, std::vector<std::string> flags,
                                      std::vector<std::string> args = {"x=1"}) const {
    std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nnodes=" + nnodes, "--master_port=" + std::to_string(port),
                                     "--rdzv_token_file=" + token, "--rdzv_last_call_s=1", "--heartbeat_timeout_s=3",
                                     "--shutdown_grace_s=2"};
    if (std::none_of(flags.begin(), flags.end(), [](const std::string& f) { return f.rfind("--nproc_per_node", 0) == 0; })) {
      argv.push_back("--nproc_per_node=2");
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(script);
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  void create(const std::string& name) const { std::ofstream(base + "/" + name) << "1"; }
};

// Issue 46 (9, 10): a node started with another command, or another job's --rdzv_id on the same
// port, is refused with one line (exit 2) before it joins; the running round is not disturbed.
TEST(Elastic, ANodeOfAnotherCommandOrJobIsRefusedAndTheRoundGoesOn) {
  const ScriptJob job;
  test::Background a(job.scriptNode("1:2", {}), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("round 0: nodes 0 (world 2)", 60)) << test::readFile(a.log);
  const struct {
    std::vector<std::string> flags, args;
    std::string line;
  } cases[] = {
      {{"--nproc_per_node=1"}, {"x=1"}, "--nproc_per_node is '1' here but '2' in the job"},
      {{}, {"x=2"}, "worker argument 1 is 'x=2' here but 'x=1' in the job"},
      {{"--max_restarts=3"}, {"x=1"}, "--max_restarts is '3' here but '0' in the job"},
      {{"--rdzv_id=another"}, {"x=1"}, "serves elastic job 'default' and this launcher's --rdzv_id is 'another'"},
  };
  for (const auto& bad : cases) {
    const auto run = test::runCommand(job.scriptNode("1:2", bad.flags, bad.args), 60);
    EXPECT_EQ(run.exitCode, 2) << run.output;
    EXPECT_NE(run.output.find(bad.line), std::string::npos) << run.output;
  }
  job.create("finish");
  EXPECT_EQ(a.wait(60), 0) << test::readFile(a.log);
  const std::string log = test::readFile(a.log);
  EXPECT_EQ(log.find("round 1"), std::string::npos) << log;  // nobody was admitted, nothing restarted
  EXPECT_EQ(log.find("waiting"), std::string::npos) << log;
}

// Issue 46 (13): node 1's launcher is killed; node 0's rank then fails (as its connections to the
// dead ranks reset). The round's end names node 1, not node 0's rank.
TEST(Elastic, APeerNodesDeathIsBlamedOnThatNodeNotOnTheRankThatFailedAfterIt) {
  const ScriptJob job;
  test::Background a(job.scriptNode("1:2", {}), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.scriptNode("1:2", {}), job.base + "/b.log");
  ASSERT_TRUE(a.waitFor("round 0: nodes 0,1 (world 4)", 60)) << test::readFile(a.log);
  ASSERT_TRUE(waitForFile(job.base + "/pid.1.0", 30) && waitForFile(job.base + "/pid.1.1", 30));
  const std::vector<pid_t> workersB = childrenOf(b.pid);
  ::kill(b.pid, SIGKILL);
  ASSERT_EQ(b.wait(30), 128 + SIGKILL);
  for (pid_t worker : workersB) {
    for (int i = 0; i < 500 && alive(worker); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_FALSE(alive(worker)) << "node 1's worker " << worker << " outlived its launcher";
  }
  job.create("fail.0");
  EXPECT_EQ(a.wait(60), 1) << test::readFile(a.log);
  const std::string log = test::readFile(a.log);
  EXPECT_NE(log.find("the job ends: node 1 left ("), std::string::npos) << log;
  EXPECT_NE(log.find("was failure 1 and --max_restarts=0"), std::string::npos) << log;
  EXPECT_EQ(log.find("the job ends: node 0"), std::string::npos) << log;
}

// Issue 46 (18): both launchers are stopped longer than the heartbeat timeout; the hosting one is
// continued first and node 1 a second later. The host does not count its own absence as node 1's
// silence: nobody is declared gone, and the job finishes.
TEST(Elastic, AStoppedHostDoesNotJudgeTheOthersByItsOwnGap) {
  const ScriptJob job;
  test::Background a(job.scriptNode("1:2", {}), job.base + "/a.log");
  ASSERT_TRUE(a.waitFor("this is node 0", 60)) << test::readFile(a.log);
  test::Background b(job.scriptNode("1:2", {}), job.base + "/b.log");
  ASSERT_TRUE(a.waitFor("round 0: nodes 0,1 (world 4)", 60)) << test::readFile(a.log);
  ASSERT_TRUE(waitForFile(job.base + "/pid.1.1", 30));
  ::kill(b.pid, SIGSTOP);
  ::kill(a.pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(4));  // the scenario: away past the 3 s timeout
  ::kill(a.pid, SIGCONT);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // node 1 stays away 1 s after the host is back
  ::kill(b.pid, SIGCONT);
  job.create("finish");
  EXPECT_EQ(a.wait(60), 0) << test::readFile(a.log);
  EXPECT_EQ(b.wait(60), 0) << test::readFile(b.log);
  const std::string logs = test::readFile(a.log) + test::readFile(b.log);
  EXPECT_EQ(logs.find(" left ("), std::string::npos) << logs;
  EXPECT_EQ(logs.find("round 1"), std::string::npos) << logs;
}

struct BadElastic {
  std::vector<std::string> flags;
  std::string message;
};

class ElasticBadInput : public ::testing::TestWithParam<BadElastic> {};

TEST_P(ElasticBadInput, IsOneLineAndExit2) {
  const Job job;
  std::vector<std::string> argv = {DDP_LAUNCH_BIN};
  for (std::string flag : GetParam().flags) {
    if (flag == "TOKEN") flag = "--rdzv_token_file=" + job.token;
    argv.push_back(flag);
  }
  argv.insert(argv.end(), {"--master_port=" + std::to_string(job.port), DDP_WORKER_BIN, kConfig});
  const auto run = test::runCommand(argv, 60);
  EXPECT_EQ(run.exitCode, 2) << run.output;
  EXPECT_NE(run.output.find(GetParam().message), std::string::npos) << run.output;
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Elastic, ElasticBadInput,
    ::testing::Values(
        BadElastic{{"--nnodes=3:2", "TOKEN"}, "--nnodes=3:2: MIN 3 is more than MAX 2"},
        BadElastic{{"--nnodes=0:2", "TOKEN"}, "--nnodes=0:2: an elastic job needs at least one node"},
        BadElastic{{"--nnodes=1:2", "--node_rank=1", "TOKEN"}, "in an elastic job the rendezvous assigns the node ranks"},
        BadElastic{{"--nnodes=1:2", "--rdzv_token_file=/nonexistent/token"}, "/nonexistent/token"},
        BadElastic{{"--nnodes=1:2"}, "--nnodes=1:2: the nodes of an elastic job share a secret token"},
        // torchrun's c10d rendezvous makes --nnodes=2 the elastic 2:2; the line says what was given.
        BadElastic{{"--nnodes=2", "--rdzv_backend=c10d"}, "--nnodes=2: the nodes of an elastic job share a secret token"},
        BadElastic{{"--nnodes=2", "--rdzv_last_call_s=5", "TOKEN"}, "--rdzv_last_call_s is for elastic jobs"}));

}  // namespace
}  // namespace ddp
