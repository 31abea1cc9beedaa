// --gpus: the choice is a pure function of NVML's table; every case here is a table a host can show.
#include "launcher/gpu_select.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "launcher/gpu_launch.h"
#include "launcher/nvml.h"

namespace ddp::launcher {
namespace {

GpuInfo gpu(int index, uint64_t usedMiB, int util, uint64_t totalMiB = 81559) {
  GpuInfo g;
  g.index = index;
  g.name = "NVIDIA H100 80GB HBM3";
  g.uuid = "GPU-" + std::to_string(1000 + index) + "aaaa-bbbb";
  char bus[32];
  std::snprintf(bus, sizeof bus, "00000000:%02X:00.0", 0x18 + 0x10 * index);
  g.pciBusId = bus;
  g.totalMiB = totalMiB;
  g.usedMiB = usedMiB;
  g.freeMiB = totalMiB - usedMiB;
  g.utilizationPercent = util;
  return g;
}

std::string errorOf(const std::vector<GpuInfo>& table, const std::string& spec,
                    const std::optional<std::string>& visible = std::nullopt) {
  try {
    chooseGpus(table, parseGpuSpec(spec), visible);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(GpuSpec, ParsesAutoAutoNAndLists) {
  EXPECT_EQ(parseGpuSpec("auto").kind, GpuRequest::Kind::kAuto);
  EXPECT_EQ(parseGpuSpec("auto").count, 0);
  EXPECT_EQ(parseGpuSpec("auto:3").count, 3);
  EXPECT_EQ(parseGpuSpec("2,3").indices, (std::vector<int>{2, 3}));
  EXPECT_EQ(parseGpuSpec("5").indices, (std::vector<int>{5}));
  for (const std::string bad : {"auto:0", "auto:x", "gpu", "1,,2", "1,1", "-1", "", "auto:"}) {
    EXPECT_THROW(parseGpuSpec(bad), ConfigError) << bad;
  }
}

TEST(GpuChoice, AutoTakesMostFreeMemoryFirstAndSkipsBusyGpus) {
  // 0: 10 GiB used (busy); 1: idle, 40 GiB card; 2: idle 80 GiB; 3: 95% utilised; 4: 500 MiB used.
  const std::vector<GpuInfo> table = {gpu(0, 10240, 0), gpu(1, 0, 0, 40960), gpu(2, 0, 0), gpu(3, 0, 95),
                                      gpu(4, 500, 5)};
  const GpuChoice all = chooseGpus(table, parseGpuSpec("auto"), std::nullopt);
  EXPECT_EQ(all.chosen, (std::vector<int>{2, 4, 1}));  // free: 81559, 81059, 40960
  EXPECT_EQ(all.cudaVisibleDevices, "2,4,1");
  EXPECT_EQ(all.count(), 3);
  EXPECT_EQ(all.verdict[0], "skipped: memory in use 10240 MiB > --gpu_max_used_mb=1024");
  EXPECT_EQ(all.verdict[2], "local rank 0");
  EXPECT_EQ(all.verdict[3], "skipped: utilisation 95% > --gpu_max_util=30");
  EXPECT_EQ(all.verdict[1], "local rank 2");

  const GpuChoice two = chooseGpus(table, parseGpuSpec("auto:2"), std::nullopt);
  EXPECT_EQ(two.chosen, (std::vector<int>{2, 4}));
  EXPECT_EQ(two.verdict[1], "not needed (auto:2)");

  GpuRequest lenient = parseGpuSpec("auto");
  lenient.maxUsedMiB = 20000;
  lenient.maxUtilizationPercent = 100;
  EXPECT_EQ(chooseGpus(table, lenient, std::nullopt).chosen, (std::vector<int>{2, 3, 4, 0, 1}));
}

TEST(GpuChoice, EqualFreeMemoryKeepsNvidiaSmiOrderAndUnknownUtilisationCountsAsIdle) {
  const std::vector<GpuInfo> table = {gpu(3, 0, -1), gpu(1, 0, 0), gpu(0, 0, 0), gpu(2, 0, -1)};
  EXPECT_EQ(chooseGpus(table, parseGpuSpec("auto"), std::nullopt).chosen, (std::vector<int>{0, 1, 2, 3}));
}

TEST(GpuChoice, TooFewSuitableGpusNamesEachOneAndWhy) {
  const std::vector<GpuInfo> table = {gpu(0, 30000, 0), gpu(1, 0, 0), gpu(2, 0, 97)};
  const std::string e = errorOf(table, "auto:2");
  EXPECT_EQ(e, "--gpus auto:2 found 1 suitable GPU(s) of 3: GPU 0 (memory in use 30000 MiB > "
               "--gpu_max_used_mb=1024), GPU 2 (utilisation 97% > --gpu_max_util=30); ask for fewer, free the "
               "GPUs, or raise --gpu_max_used_mb / --gpu_max_util");
  EXPECT_NE(errorOf({gpu(0, 30000, 0)}, "auto").find("found 0 suitable GPU(s) of 1"), std::string::npos);
  EXPECT_NE(errorOf({}, "auto").find("found 0 suitable GPU(s) of 0 (no GPU)"), std::string::npos);
}

TEST(GpuChoice, FromZeroToEightGpus) {
  for (int n = 0; n <= 8; ++n) {
    std::vector<GpuInfo> table;
    for (int i = 0; i < n; ++i) table.push_back(gpu(i, static_cast<uint64_t>(100 * (n - i)), 0));
    if (n == 0) {
      EXPECT_THROW(chooseGpus(table, parseGpuSpec("auto"), std::nullopt), ConfigError);
      continue;
    }
    const GpuChoice c = chooseGpus(table, parseGpuSpec("auto"), std::nullopt);
    ASSERT_EQ(c.count(), n);
    for (int r = 0; r < n; ++r) EXPECT_EQ(c.chosen[r], n - 1 - r) << "least used first";
    EXPECT_THROW(chooseGpus(table, parseGpuSpec("auto:" + std::to_string(n + 1)), std::nullopt), ConfigError);
  }
}

TEST(GpuChoice, AListTakesThoseGpusBusyOrNot) {
  const std::vector<GpuInfo> table = {gpu(0, 0, 0), gpu(1, 0, 0), gpu(2, 9000, 80), gpu(3, 0, 0)};
  const GpuChoice c = chooseGpus(table, parseGpuSpec("3,2"), std::nullopt);
  EXPECT_EQ(c.chosen, (std::vector<int>{3, 2}));
  EXPECT_EQ(c.cudaVisibleDevices, "3,2");
  EXPECT_EQ(c.verdict[3], "local rank 0");
  EXPECT_EQ(c.verdict[2], "local rank 1 (busy: memory in use 9000 MiB > --gpu_max_used_mb=1024)");
  EXPECT_EQ(c.verdict[0], "");
  EXPECT_NE(errorOf(table, "1,4").find("GPU 4 does not exist (this host has 4 GPU(s), numbered 0..3"),
            std::string::npos);
}

TEST(GpuChoice, CudaVisibleDevicesLimitsTheCandidatesByIndexOrUuid) {
  const std::vector<GpuInfo> table = {gpu(0, 0, 0), gpu(1, 2000, 0), gpu(2, 10, 0), gpu(3, 5, 0)};
  const GpuChoice c = chooseGpus(table, parseGpuSpec("auto"), std::string("3,GPU-1002,1"));
  EXPECT_EQ(c.chosen, (std::vector<int>{3, 2}));  // 1 is busy; 0 is hidden
  EXPECT_EQ(c.verdict[0], "not in CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(c.verdict[1], "skipped: memory in use 2000 MiB > --gpu_max_used_mb=1024");
  EXPECT_NE(errorOf(table, "auto", std::string("7")).find("names '7', which is not a GPU of this host"),
            std::string::npos);
  EXPECT_NE(errorOf(table, "auto", std::string("GPU-99")).find("not a GPU of this host"), std::string::npos);
  EXPECT_NE(errorOf(table, "auto", std::string("GPU-100")).find("matches more than one GPU"), std::string::npos);
  EXPECT_NE(errorOf(table, "0,2", std::string("2,3")).find("takes GPU 0 but CUDA_VISIBLE_DEVICES=2,3 hides it"),
            std::string::npos);
  const GpuChoice unset = chooseGpus(table, parseGpuSpec("auto"), std::string(""));  // empty = unset
  EXPECT_EQ(unset.chosen, (std::vector<int>{0, 3, 2}));
  EXPECT_EQ(unset.verdict[1], "skipped: memory in use 2000 MiB > --gpu_max_used_mb=1024");
}

TEST(GpuChoice, MigInstancesArePassedOnAsGiven) {
  const std::vector<GpuInfo> table = {gpu(0, 0, -1)};
  const std::string mig = "MIG-4f6e0c1a-1111-2222-3333-444455556666,MIG-9a0b1c2d-1111-2222-3333-444455556666";
  const GpuChoice all = chooseGpus(table, parseGpuSpec("auto"), mig);
  EXPECT_EQ(all.count(), 2);
  EXPECT_EQ(all.cudaVisibleDevices, mig);
  const GpuChoice one = chooseGpus(table, parseGpuSpec("auto:1"), mig);
  EXPECT_EQ(one.cudaVisibleDevices, "MIG-4f6e0c1a-1111-2222-3333-444455556666");
  EXPECT_THROW(chooseGpus(table, parseGpuSpec("auto:3"), mig), ConfigError);
  EXPECT_THROW(chooseGpus(table, parseGpuSpec("0"), mig), ConfigError);
  EXPECT_THROW(chooseGpus(table, parseGpuSpec("auto"), std::string("0,") + mig), ConfigError);
}

TEST(GpuChoice, TheTableShowsEveryGpuAndItsVerdict) {
  const std::vector<GpuInfo> table = {gpu(1, 20000, 3), gpu(0, 0, 0)};
  const GpuChoice c = chooseGpus(table, parseGpuSpec("auto"), std::nullopt);
  const std::string text = formatGpuTable(table, c);
  EXPECT_EQ(text,
            "GPU  name                      PCI bus id         free / total MiB  util  choice\n"
            "  0  NVIDIA H100 80GB HBM3     00000000:18:00.0    81559 / 81559      0%  local rank 0\n"
            "  1  NVIDIA H100 80GB HBM3     00000000:28:00.0    61559 / 81559      3%  skipped: memory in use "
            "20000 MiB > --gpu_max_used_mb=1024\n");
}

// The real NVML query on this host, and what the launcher does with it.
TEST(GpuLaunch, WithoutNvmlGpusIsOneClearErrorAndAutoCountsCpus) {
  std::string why;
  const auto table = queryGpus(&why);
  if (table) GTEST_SKIP() << "NVML is installed here (" << table->size() << " GPUs): covered by scripts/gpu_check.sh";
  EXPECT_NE(why.find("no NVIDIA driver"), std::string::npos) << why;
  LaunchOptions options;
  options.gpus = "auto:1";
  try {
    resolveGpus(options, {});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--gpus auto:1 needs NVML (libnvidia-ml.so.1, part of the NVIDIA driver)"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("drop --gpus to train on CPU"), std::string::npos);
  }
  LaunchOptions autoCount;
  autoCount.nprocAuto = true;
  const std::string line = resolveGpus(autoCount, {});
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_EQ(autoCount.nprocPerNode, CPU_COUNT(&set));
  EXPECT_NE(line.find("no GPU: one worker per CPU"), std::string::npos) << line;
  EXPECT_TRUE(autoCount.cudaVisibleDevices.empty());
}

}  // namespace
}  // namespace ddp::launcher
