// Both directions with torchrun (Python PyTorch 2.x's launcher, beside DDP_PYTHON):
// torchrun starts our worker (static, standalone and c10d rendezvous) and it trains
// exactly as under ddp-launch; ddp-launch starts a Python DDP script (env:// and the
// legacy --local_rank argument) and it trains as a single process would.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "tests/support/loopback.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

std::string torchrun() { return (fs::path(DDP_PYTHON).parent_path() / "torchrun").string(); }
std::string config() { return std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml"; }

nlohmann::json summaryOf(const std::string& dir) { return nlohmann::json::parse(test::readFile(dir + "/summary.json")); }

const std::vector<std::string> kTrain{"train.max_steps=30", "train.log_every=10"};

nlohmann::json referenceRun() {
  static nlohmann::json summary = [] {
    const std::string dir = test::makeTempDir("torchrun_ref");
    std::vector<std::string> argv{DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, config(), "output.dir=" + dir};
    argv.insert(argv.end(), kTrain.begin(), kTrain.end());
    const auto run = test::runCommand(argv, 300);
    EXPECT_EQ(run.exitCode, 0) << run.output;
    return summaryOf(dir);
  }();
  return summary;
}

class TorchrunStartsOurWorker : public ::testing::TestWithParam<std::string> {};

bool libtorch1() { return test::readFile(std::string(DDP_BINARY_DIR) + "/libtorch_version.txt").rfind("1.", 0) == 0; }

std::vector<std::string> torchrunArgv(const std::string& form) {
  std::vector<std::string> argv{torchrun(), "--nproc_per_node=2"};
  // torchrun's static rendezvous needs a port number up front and binds it itself.
  const std::string port = std::to_string(test::freePort());
  if (form == "static") argv.push_back("--master_port=" + port);
  if (form == "standalone") argv.push_back("--standalone");
  if (form == "c10d") argv.insert(argv.end(), {"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port});
  return argv;
}

TEST_P(TorchrunStartsOurWorker, TrainsAndExportsLikeUnderDdpLaunch) {
  const std::string form = GetParam();
  const std::string dir = test::makeTempDir("torchrun_" + form);
  std::vector<std::string> argv = torchrunArgv(form);
  argv.insert(argv.end(), {"--no_python", DDP_WORKER_BIN, config(), "output.dir=" + dir});
  argv.insert(argv.end(), kTrain.begin(), kTrain.end());
  // c10d's errors shown: a rank 0 that tried to serve the store the agent already serves would log
  // "The server socket on P has failed to bind" (LibTorch 2.x forgives it; 1.13 fails outright).
  const auto run = test::runCommand(argv, 300, {"TORCH_CPP_LOG_LEVEL=ERROR"});
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_EQ(run.output.find("failed to bind"), std::string::npos) << "rank 0 did not join torchrun's store as a client:\n"
                                                                  << run.output;
  const auto summary = summaryOf(dir);
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_TRUE(fs::exists(dir + "/model.pt"));
  // Same config, seed, sampler and world: the same training, to the last bit of the loss.
  const auto reference = referenceRun();
  EXPECT_EQ(summary["steps"], reference["steps"]);
  EXPECT_NEAR(summary["final_loss"].get<double>(), reference["final_loss"].get<double>(), 1e-6) << run.output;
  EXPECT_EQ(summary["test_correct"], reference["test_correct"]);
}

// LibTorch 1.x's store client and PyTorch 2.x's store number their requests differently, so
// the 1.x worker gets no answer from torchrun's agent store: it must say so in one line within
// comm.timeout_s (plus the start-up grace), not hang until someone kills the job.
class TorchrunStartsOurLibTorch1Worker : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchrunStartsOurLibTorch1Worker, FailsWithOneLineNotAHang) {
  const std::string dir = test::makeTempDir("torchrun1_" + GetParam());
  std::vector<std::string> argv = torchrunArgv(GetParam());
  argv.insert(argv.end(), {"--no_python", DDP_WORKER_BIN, config(), "output.dir=" + dir, "comm.timeout_s=5"});
  const auto run = test::runCommand(argv, 120, {"TORCH_CPP_LOG_LEVEL=ERROR"});
  EXPECT_FALSE(run.timedOut) << run.output;
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("whose store client cannot talk to a PyTorch 2.x store"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Exception raised from"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(dir + "/model.pt"));
}

// Which of the two applies is a property of the build, not a skip: a LibTorch 2.x build runs the
// first, the Debian 1.13 build the second.
const std::vector<std::string> kForms{"static", "standalone", "c10d"};
const std::vector<std::string> kNone;
INSTANTIATE_TEST_SUITE_P(Rendezvous, TorchrunStartsOurWorker, ::testing::ValuesIn(libtorch1() ? kNone : kForms));
INSTANTIATE_TEST_SUITE_P(Rendezvous, TorchrunStartsOurLibTorch1Worker, ::testing::ValuesIn(libtorch1() ? kForms : kNone));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TorchrunStartsOurWorker);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TorchrunStartsOurLibTorch1Worker);

// torchrun's direct children running our worker (the agent starts them with --no_python).
std::vector<pid_t> workersOf(pid_t agent) {
  std::vector<pid_t> out;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(agent) + "/task")) {
    std::ifstream in(task.path() / "children");
    for (pid_t p; in >> p;) {
      std::error_code ec;
      if (fs::read_symlink("/proc/" + std::to_string(p) + "/exe", ec) == fs::path(DDP_WORKER_BIN)) out.push_back(p);
    }
  }
  return out;
}

// LibTorch 2.x builds only (a 1.x worker cannot join torchrun's store: see above).
class TorchrunRestarts : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchrunRestarts, AKilledRankRestartsTheGroupOnTheAgentsStoreAndResumes) {
  // The static agent keeps one store across restarts: attempt 1 must not meet attempt 0's keys.
  const std::string dir = test::makeTempDir("torchrun_restart");
  std::vector<std::string> argv{torchrun(), "--nproc_per_node=2", "--max_restarts=1",
                                "--master_port=" + std::to_string(test::freePort()), "--no_python", DDP_WORKER_BIN,
                                config(), "output.dir=" + dir, "train.max_steps=30", "train.log_every=1",
                                "train.epochs=1000", "checkpoint.dir=" + dir + "/ckpt", "checkpoint.every_steps=5",
                                "resume=auto", "comm.timeout_s=60"};
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  const pid_t pid = test::startInGroup(argv, out[1]);
  ::close(out[1]);
  // Blocking reads of the job's output: kill rank 1 once step 12 is logged (two checkpoints
  // behind it), then read to the end so nothing blocks on a full pipe.
  std::string output;
  size_t killed = 0;
  char chunk[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (true) {
    // A hung job is a failure (reported below), not a test that never ends.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd ready{out[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&ready, 1, static_cast<int>(left.count())) == 0) {
      ::kill(-pid, SIGKILL);
      output += "\n[test] the job hung; killed after 300 s";
      break;
    }
    const ssize_t n = ::read(out[0], chunk, sizeof chunk);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    output.append(chunk, static_cast<size_t>(n));
    if (killed == 0 && output.find("step 12/") != std::string::npos) {
      const auto workers = workersOf(pid);
      for (pid_t w : workers) ::kill(w, SIGKILL);  // the whole attempt dies, as on a node loss
      killed = workers.size();
    }
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::kill(-pid, SIGKILL);  // anything left of the job
  ASSERT_EQ(killed, 2u) << output;
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  EXPECT_NE(output.find("resumed from"), std::string::npos) << output;
  const auto summary = summaryOf(dir);
  EXPECT_EQ(summary["steps"], 30);
  EXPECT_EQ(summary["world_size"], 2);
}

const std::vector<std::string> kStatic{"static"};
INSTANTIATE_TEST_SUITE_P(Static, TorchrunRestarts, ::testing::ValuesIn(libtorch1() ? kNone : kStatic));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TorchrunRestarts);

class DdpLaunchStartsAPythonScript : public ::testing::TestWithParam<bool> {};

TEST_P(DdpLaunchStartsAPythonScript, TrainsLikeASingleProcess) {
  const bool legacy = GetParam();
  std::vector<std::string> argv{DDP_LAUNCH_BIN, "--nproc_per_node=2"};
  if (legacy) argv.push_back("--use_env=false");
  argv.insert(argv.end(), {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/ddp_script.py"});
  if (legacy) argv.push_back("--legacy");
  const auto run = test::runCommand(argv, 300);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  int reports = 0;
  for (size_t at = run.output.find("{\"rank\""); at != std::string::npos; at = run.output.find("{\"rank\"", at + 1)) {
    const auto line = nlohmann::json::parse(run.output.substr(at, run.output.find('\n', at) - at));
    EXPECT_TRUE(line["ranks_equal"].get<bool>()) << run.output;
    EXPECT_TRUE(line["matches_single_process"].get<bool>()) << run.output;
    EXPECT_EQ(line["legacy"], legacy);
    ++reports;
  }
  EXPECT_EQ(reports, 2) << run.output;
}

INSTANTIATE_TEST_SUITE_P(EnvAndLegacy, DdpLaunchStartsAPythonScript, ::testing::Bool());

// A Python worker started under another name — an executable #! script, a shell entrypoint that
// execs python (a container's command) — hosts its own TCPStore on MASTER_PORT as under torchrun:
// the launcher must not hold the port for it (rank 0 failed with EADDRINUSE, every time).
TEST(DropIn, APythonWorkerUnderAnotherNameHostsItsOwnStore) {
  const std::string dir = test::makeTempDir("python_named_otherwise");
  const std::string body =
      "import torch, torch.distributed as dist\n"
      "dist.init_process_group('gloo')\n"
      "t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)\n"
      "print('rank', dist.get_rank(), 'sum', t.item(), flush=True)\n"
      "dist.destroy_process_group()\n";
  std::ofstream(dir + "/train") << "#!" << DDP_PYTHON << "\n" << body;
  std::ofstream(dir + "/dist.py") << body;
  std::ofstream(dir + "/entrypoint.sh") << "#!/bin/sh\nexec " << DDP_PYTHON << " " << dir << "/dist.py \"$@\"\n";
  for (const char* name : {"/train", "/entrypoint.sh"}) {
    fs::permissions(dir + name, fs::perms::owner_all);
    const auto run = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=2", dir + name}, 120);
    EXPECT_EQ(run.exitCode, 0) << name << "\n" << run.output;
    EXPECT_NE(run.output.find("rank 0 sum 3.0"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("rank 1 sum 3.0"), std::string::npos) << run.output;
  }
  fs::remove_all(dir);
}

// --- issue 45: a drop-in where torchrun's scripts and manifests run -------------------------------

// The Python beside DDP_PYTHON first on PATH: what "python3 on PATH" finds when a pod or a job
// script runs ddp-launch with a .py or -m, as torchrun runs them with its own interpreter.
std::string pathWithPython() {
  const char* path = std::getenv("PATH");
  return "PATH=" + fs::path(DDP_PYTHON).parent_path().string() + ":" + (path ? path : "/usr/bin:/bin");
}

// Two pods of a Kubeflow PyTorchJob (nprocPerNode: 1), as the operator sets them up: PET_* for
// torchrun, WORLD_SIZE/RANK = the pod count and index, the token from a Secret as DDP_RDZV_TOKEN.
// ddp-launch with no flags in each forms one job of two; without PET_* it refuses to train alone.
TEST(DropIn, TwoPodsOfAPyTorchJobFormOneJobFromThePetVariables) {
  const std::string dir = test::makeTempDir("pods");
  const std::string port = std::to_string(test::freePort());
  auto pod = [&](int index, bool pet) {
    std::vector<std::string> argv{"/usr/bin/env", "WORLD_SIZE=2", "RANK=" + std::to_string(index),
                                  "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                                  "DDP_RDZV_TOKEN=5f4dcc3b5aa765d61d8327deb882cf99"};
    if (pet) {
      argv.insert(argv.end(), {"PET_NNODES=2", "PET_NPROC_PER_NODE=1", "PET_NODE_RANK=" + std::to_string(index),
                               "PET_MASTER_ADDR=127.0.0.1", "PET_MASTER_PORT=" + port});
    }
    argv.insert(argv.end(), {DDP_LAUNCH_BIN, DDP_WORKER_BIN, config(), "output.dir=" + dir + "/out"});
    argv.insert(argv.end(), kTrain.begin(), kTrain.end());
    return argv;
  };
  test::Background pod0(pod(0, true), dir + "/pod0.log");
  test::Background pod1(pod(1, true), dir + "/pod1.log");
  EXPECT_EQ(pod0.wait(300), 0) << test::readFile(pod0.log);
  EXPECT_EQ(pod1.wait(300), 0) << test::readFile(pod1.log);
  const std::string log0 = test::readFile(pod0.log);
  EXPECT_NE(log0.find("from torchrun's PET_* variables (e.g. a Kubeflow PyTorchJob's): --nnodes=2 "
                      "--nproc_per_node=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=" + port),
            std::string::npos)
      << log0;
  EXPECT_EQ(summaryOf(dir + "/out")["world_size"], 2);

  const auto alone = test::runCommand(pod(1, false), 60);
  EXPECT_EQ(alone.exitCode, 2) << alone.output;
  EXPECT_NE(alone.output.find("the environment says this is one of WORLD_SIZE=2 processes (RANK=1"),
            std::string::npos)
      << alone.output;
}

// What a Python script sees of its launcher: under ddp-launch what it sees under torchrun (the pinned
// PyTorch's, run here side by side): the contract's values, a fresh uuid as TORCHELASTIC_RUN_ID for a
// single-node job without --master_port (the same on every rank) and "none" with one, torchrun's
// TORCH_NCCL_ASYNC_ERROR_HANDLING, and PyTorch's own log levels (no TORCH_CPP_LOG_LEVEL, no
// GLOG_minloglevel: the NCCL watchdog's timeout reports are log lines).
TEST(DropIn, APythonWorkerSeesTorchrunsEnvironment) {
  const std::string dir = test::makeTempDir("python_env");
  const std::string script = dir + "/env.py";
  const std::vector<std::string> keys = {
      "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
      "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
      "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_CPP_LOG_LEVEL", "GLOG_minloglevel", "OMP_NUM_THREADS"};
  std::string list;
  for (const auto& key : keys) list += (list.empty() ? "'" : ", '") + key + "'";
  std::ofstream(script) << "import json, os\n"
                           "import sys\n"
                           "sys.stdout.write(json.dumps({k: os.environ.get(k, '(unset)') for k in [" << list << "]}) + '\\n')\n"
                           "sys.stdout.flush()\n";
  // Each rank's line, by RANK.
  auto seen = [&](const std::vector<std::string>& launcher, const std::vector<std::string>& flags) {
    std::vector<std::string> argv{"/usr/bin/env", "-u", "TORCH_CPP_LOG_LEVEL", "-u", "GLOG_minloglevel", "-u",
                                  "TORCH_NCCL_ASYNC_ERROR_HANDLING", "-u", "OMP_NUM_THREADS"};
    argv.insert(argv.end(), launcher.begin(), launcher.end());
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(script);
    const auto run = test::runCommand(argv, 120, {pathWithPython()});
    EXPECT_EQ(run.exitCode, 0) << run.output;
    std::map<std::string, nlohmann::json> ranks;
    for (size_t at = run.output.find("{\"RANK\""); at != std::string::npos; at = run.output.find("{\"RANK\"", at + 1)) {
      // Up to its '}' (no nesting): torchrun's ranks share one stdout, so two objects can meet on a line.
      const auto line = nlohmann::json::parse(run.output.substr(at, run.output.find('}', at) + 1 - at));
      ranks[line["RANK"].get<std::string>()] = line;
    }
    EXPECT_EQ(ranks.size(), 2u) << run.output;
    return ranks;
  };
  const auto isUuid = [](const std::string& id) {
    return id.size() == 36 && id[8] == '-' && id[13] == '-' && id[14] == '4' && id[18] == '-' && id[23] == '-';
  };
  const std::string port = std::to_string(test::freePort());
  for (const std::vector<std::string>& flags : {std::vector<std::string>{"--nproc_per_node=2"},
                                                std::vector<std::string>{"--nproc_per_node=2", "--master_port=" + port}}) {
    SCOPED_TRACE(flags.back());
    const auto theirs = seen({torchrun()}, flags);
    const auto ours = seen({DDP_LAUNCH_BIN}, flags);
    for (const auto& [rank, line] : theirs) {
      ASSERT_EQ(ours.count(rank), 1u) << "rank " << rank;
      for (const auto& key : keys) {
        const std::string expected = line[key].get<std::string>();
        const std::string actual = ours.at(rank)[key].get<std::string>();
        if (key == "TORCHELASTIC_RUN_ID" && isUuid(expected)) {
          EXPECT_TRUE(isUuid(actual)) << "rank " << rank << ": " << actual;
          EXPECT_EQ(actual, ours.begin()->second[key].get<std::string>()) << "rank " << rank;
        } else {
          EXPECT_EQ(actual, expected) << "rank " << rank << " " << key;
        }
      }
    }
  }
}

// A Python worker decorated with torch.distributed.elastic's @record writes its exception to
// TORCHELASTIC_ERROR_FILE; the failure line and summary show it, as torchrun's do. The script has
// no #! line: ddp-launch runs it with python3 on PATH, as torchrun would.
TEST(DropIn, ARecordedPythonExceptionIsInTheFailureSummary) {
  const std::string dir = test::makeTempDir("record");
  const std::string script = dir + "/train.py";
  std::ofstream(script) << "import os\n"
                           "from torch.distributed.elastic.multiprocessing.errors import record\n"
                           "@record\n"
                           "def main():\n"
                           "    if os.environ['RANK'] == '1' and len(os.environ['TORCHELASTIC_RUN_ID']) == 36:\n"
                           "        raise ValueError('bad learning rate on rank 1')\n"
                           "main()\n";
  const auto run = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=2", script}, 120, {pathWithPython()});
  EXPECT_EQ(run.exitCode, 1) << run.output;
  EXPECT_NE(run.output.find("failed with exit code 1: ValueError: bad learning rate on rank 1 (" + script +
                            ", line 6, in main)"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("| error file: ValueError: bad learning rate on rank 1"), std::string::npos) << run.output;

  // Our worker writes one too: its one-line error.
  const auto worker = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=1", "--max_restarts=0", DDP_WORKER_BIN,
                                        config(), "train.lr=-1", "output.dir=" + dir + "/out"}, 120);
  EXPECT_EQ(worker.exitCode, 2) << worker.output;
  EXPECT_NE(worker.output.find("| error file: worker: config: "), std::string::npos) << worker.output;

  // -m runs a module through Python, as torchrun's -m.
  const auto module = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=2", "-m", "platform"}, 60, {pathWithPython()});
  EXPECT_EQ(module.exitCode, 0) << module.output;
  EXPECT_NE(module.output.find("[rank 1] Linux"), std::string::npos) << module.output;
}

}  // namespace
}  // namespace ddp
