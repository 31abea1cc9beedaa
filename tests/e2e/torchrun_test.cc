// Both directions with torchrun (Python PyTorch 2.x's launcher, beside DDP_PYTHON):
// torchrun starts our worker (static, standalone and c10d rendezvous) and it trains
// exactly as under ddp-launch; ddp-launch starts a Python DDP script (env:// and the
// legacy --local_rank argument) and it trains as a single process would.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "tests/e2e/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

std::string torchrun() { return (fs::path(DDP_PYTHON).parent_path() / "torchrun").string(); }
std::string config() { return std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml"; }

// torchrun's static rendezvous needs a port number up front and binds it itself. A port just
// released by the kernel's choice (port 0) is free unless another process races for it.
uint16_t unusedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

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

TEST_P(TorchrunStartsOurWorker, TrainsAndExportsLikeUnderDdpLaunch) {
  const std::string form = GetParam();
  const std::string dir = test::makeTempDir("torchrun_" + form);
  std::vector<std::string> argv{torchrun(), "--nproc_per_node=2"};
  const std::string port = std::to_string(unusedPort());
  if (form == "static") argv.push_back("--master_port=" + port);
  if (form == "standalone") argv.push_back("--standalone");
  if (form == "c10d") argv.insert(argv.end(), {"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port});
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

INSTANTIATE_TEST_SUITE_P(Rendezvous, TorchrunStartsOurWorker, ::testing::Values("static", "standalone", "c10d"));

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

}  // namespace
}  // namespace ddp
