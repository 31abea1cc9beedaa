// The worker's "does it fit" check against real processes: a GPT's activation estimate is a lower
// bound of what training really takes (the peak RSS of two batch sizes, measured), a batch far too
// large is refused before anything is written, and a job inside a memory cgroup (a Kubernetes pod's
// limit, Slurm's --mem) is measured against that limit, not the host's RAM.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/host_memory.h"
#include "tests/support/e2e_models.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kLayers = 4, kEmbd = 128, kBlock = 128;

// The GPT of configs/gpt_fortunes_char.yaml's shape on the docs' characters, one process, one thread.
std::vector<std::string> gptRun(const std::string& out, int64_t batch) {
  const std::string& corpus = test::docsCharCorpus("memory_fit");
  return {DDP_WORKER_BIN, std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml", "mode=single", "threads=1",
          "model.name=gpt", "model.n_layer=" + std::to_string(kLayers), "model.n_head=4",
          "model.n_embd=" + std::to_string(kEmbd), "model.block_size=" + std::to_string(kBlock), "model.bias=false",
          "data.name=tokens", "data.train_files=" + corpus + "/train_*.bin", "data.val_files=" + corpus + "/val_*.bin",
          "train.optimizer=adamw", "train.batch_size=" + std::to_string(batch), "train.max_steps=2", "eval.iters=1",
          "output.dir=" + out};
}

double peakRssMb(const std::string& out) {
  return nlohmann::json::parse(test::readFile(out + "/summary.json"))["peak_rss_mb"].get<double>();
}

int64_t vocabulary() {
  return nlohmann::json::parse(test::readFile(test::docsCharCorpus("memory_fit") + "/meta.json"))["vocab_size"].get<int64_t>();
}

// The worker's LibTorch: 1.x has no scaled_dot_product_attention (the GPT's math attention keeps
// each head's T × T softmax).
bool libtorch1() { return test::readFile(std::string(DDP_BINARY_DIR) + "/libtorch_version.txt").rfind("1.", 0) == 0; }

// docs/worker.md's estimate: 16 fp32 values a token, channel and layer (and with LibTorch 1.x
// n_head · block_size more a token and layer), 2 a token and vocabulary entry.
double activationBytes(int64_t batch) {
  const int64_t attention = libtorch1() ? 4 * kBlock : 0;
  return static_cast<double>(batch * kBlock) * 4 *
         static_cast<double>(kLayers * (16 * kEmbd + attention) + 2 * kEmbd + 2 * vocabulary());
}

TEST(MemoryFit, AGptsActivationEstimateIsALowerBoundOfWhatTrainingTakes) {
  const std::string small = test::makeTempDir("memory_fit_8"), large = test::makeTempDir("memory_fit_40");
  const auto a = test::runCommand(gptRun(small, 8), 300);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  const auto b = test::runCommand(gptRun(large, 40), 300);
  ASSERT_EQ(b.exitCode, 0) << b.output;
  const double measured = (peakRssMb(large) - peakRssMb(small)) * 1024 * 1024;
  const double estimated = activationBytes(40) - activationBytes(8);
  // Refusing on the estimate must never refuse a job that would have run, and the estimate must
  // still be near enough to catch a batch far too large (with the pip LibTorch 2.x it is ~60 % of
  // the measured growth).
  EXPECT_LE(estimated, measured) << "32 more windows took " << measured / 1048576 << " MiB";
  EXPECT_GE(estimated, measured / 2.5) << "32 more windows took " << measured / 1048576 << " MiB";
}

TEST(MemoryFit, ABatchFarTooLargeIsOneLineAndNothingWritten) {
  const std::string out = test::makeTempDir("memory_fit_huge") + "/out";
  const auto r = test::runCommand(gptRun(out, 1000000), 120);
  EXPECT_EQ(r.exitCode, 2) << r.output;
  char size[32];
  std::snprintf(size, sizeof size, "%.3g TiB", activationBytes(1000000) / std::pow(1024.0, 4));
  EXPECT_NE(r.output.find(std::string("the activations of 1000000 windows of 128 tokens ") + size), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("use a smaller train.batch_size (train.accumulate_steps keeps the batch), "
                          "train.activation_checkpointing: true"), std::string::npos) << r.output;
  for (const char* file : {"model.pt", "summary.json", "metrics.jsonl", "config.resolved.yaml"}) {
    EXPECT_FALSE(fs::exists(out + "/" + file)) << "a refused run wrote " << file;
  }
}

// A child cgroup of this process's memory cgroup with `limit` bytes, or "" where none can be made.
std::string makeMemoryCgroup(double limit) {
  const std::string text = std::to_string(static_cast<int64_t>(limit));
  for (const std::string& dir : detail::memoryCgroupDirs(test::readFile("/proc/self/cgroup"),
                                                          test::readFile("/proc/self/mountinfo"))) {
    const std::string child = dir + "/ddp_memory_fit_" + std::to_string(::getpid());
    std::error_code error;
    if (!fs::create_directory(child, error)) continue;
    const std::string file = child + (fs::exists(child + "/memory.max") ? "/memory.max" : "/memory.limit_in_bytes");
    std::ofstream(file) << text;
    if (test::readFile(file).rfind(text, 0) == 0) return file;
    ::rmdir(child.c_str());
  }
  return "";
}

TEST(MemoryFit, AJobInAMemoryCgroupIsMeasuredAgainstItsLimit) {
  const double limit = 1.5 * 1024 * 1024 * 1024;
  const double parameters = 784.0 * 10000 + 10000 + 10000.0 * 10000 + 10000 + 10000.0 * 10 + 10;
  if (2 * 12 * parameters >= hostRamBytes()) GTEST_SKIP() << "this host is too small to show the cgroup's part";
  const std::string file = makeMemoryCgroup(limit);
  if (file.empty()) GTEST_SKIP() << "no writable memory cgroup here (not root, or no memory controller)";
  const std::string dir = fs::path(file).parent_path().string();
  const std::string out = test::makeTempDir("memory_fit_cgroup") + "/out";
  // 784·10000 + 10000·10000 + 10000·10 weights and their biases (1.08e8), 12 bytes each (SGD with
  // momentum, the gradients in the buckets), on 2 ranks: 2.41 GiB, over the 1.5 GiB though the
  // host's RAM holds it.
  const std::string job = "echo $$ > " + dir + "/cgroup.procs && exec " + DDP_LAUNCH_BIN + " --nproc_per_node=2 " +
                          DDP_WORKER_BIN + " " + DDP_SOURCE_DIR + "/configs/synthetic_mlp.yaml model.hidden=[10000,10000]" +
                          " train.max_steps=1 output.dir=" + out;
  const auto r = test::runCommand({"/bin/sh", "-c", job}, 120);
  ::rmdir(dir.c_str());
  EXPECT_EQ(r.exitCode, 2) << r.output;
  EXPECT_NE(r.output.find("for the 2 ranks on this host, but this process may use 1.5 GiB (the cgroup limit in " +
                          file + ")"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl"));
  char count[32];
  std::snprintf(count, sizeof count, "has %.3g parameters", parameters);
  EXPECT_NE(r.output.find(count), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ddp
