// The memory limit the worker's "does it fit" checks use: the host's RAM or a cgroup's limit, read
// from fake /proc texts and limit files laid out as Kubernetes (cgroup v2, the pod's limit on a
// parent), Slurm (cgroup v1, the job's limit above its step) and docker without a cgroup
// namespace leave them; and once from this process's real cgroup when the test may make one.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/host_memory.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

void writeFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

const char* kV2Mounts =
    "25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    "30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n";

TEST(MemoryLimit, AKubernetesPodsLimitOnAParentBindsItsContainer) {
  const std::string root = test::makeTempDir("host_memory");
  const std::string pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-pod1.slice";
  const std::string container = pod + "/cri-containerd-abc.scope";
  writeFile(root + "/sys/fs/cgroup" + container + "/memory.max", "max\n");
  writeFile(root + "/sys/fs/cgroup" + pod + "/memory.max", "2147483648\n");
  writeFile(root + "/sys/fs/cgroup/kubepods.slice/memory.max", "8589934592\n");
  const auto files = detail::memoryLimitFiles("0::" + container + "\n", kV2Mounts, root);
  ASSERT_EQ(files.size(), 5u);  // the container, pod, burstable, kubepods, and the mount's root
  EXPECT_EQ(files.front(), root + "/sys/fs/cgroup" + container + "/memory.max");
  EXPECT_EQ(files.back(), root + "/sys/fs/cgroup/memory.max");
  const MemoryLimit limit = detail::cgroupLimit(files);
  EXPECT_EQ(limit.bytes, 2147483648.0);
  EXPECT_EQ(limit.where, root + "/sys/fs/cgroup" + pod + "/memory.max");
  EXPECT_EQ(describeMemory(limit), "this process may use 2 GiB (the cgroup limit in " + limit.where + ")");
}

TEST(MemoryLimit, ASlurmJobsV1LimitAboveItsStep) {
  const std::string root = test::makeTempDir("host_memory");
  const std::string mounts =
      "30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
      "40 25 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:16 - cgroup cgroup rw,cpu,cpuacct\n"
      "41 25 0:36 / /sys/fs/cgroup/memory rw,nosuid shared:17 - cgroup cgroup rw,memory\n";
  const std::string cgroup =
      "5:cpu,cpuacct:/slurm/uid_1000/job_42/step_0\n4:memory:/slurm/uid_1000/job_42/step_0/task_0\n1:name=systemd:/\n";
  const std::string job = root + "/sys/fs/cgroup/memory/slurm/uid_1000/job_42";
  writeFile(job + "/step_0/task_0/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "unlimited"
  writeFile(job + "/step_0/memory.limit_in_bytes", "9223372036854771712\n");
  writeFile(job + "/memory.limit_in_bytes", "4294967296\n");  // --mem=4G
  const MemoryLimit limit = detail::cgroupLimit(detail::memoryLimitFiles(cgroup, mounts, root));
  EXPECT_EQ(limit.bytes, 4294967296.0);
  EXPECT_EQ(limit.where, job + "/memory.limit_in_bytes");
}

TEST(MemoryLimit, ADockerContainerSeesItsOwnCgroupAtTheMountPoint) {
  // No cgroup namespace (cgroup v1 docker): /proc/self/cgroup names the host's path, the mount's
  // root is that same path, so the limit sits at the mount point itself.
  const std::string root = test::makeTempDir("host_memory");
  const std::string mounts = "41 25 0:36 /docker/f00 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n";
  writeFile(root + "/sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n");
  const auto files = detail::memoryLimitFiles("4:memory:/docker/f00\n", mounts, root);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(detail::cgroupLimit(files).bytes, 536870912.0);
}

TEST(MemoryLimit, NoLimitAnywhereIsNoLimit) {
  const std::string root = test::makeTempDir("host_memory");
  writeFile(root + "/sys/fs/cgroup/user.slice/memory.max", "max\n");
  const auto files = detail::memoryLimitFiles("0::/user.slice\n", kV2Mounts, root);  // the root's file is absent
  const MemoryLimit limit = detail::cgroupLimit(files);
  EXPECT_EQ(limit.bytes, 0.0);
  EXPECT_TRUE(limit.where.empty());
  EXPECT_TRUE(detail::memoryLimitFiles("0::/user.slice\n", "30 1 8:1 / / rw - ext4 /dev/sda1 rw\n", root).empty());
}

TEST(MemoryLimit, TheHostsRamWhenNoCgroupIsSmaller) {
  const MemoryLimit limit{16.0 * 1024 * 1024 * 1024, ""};
  EXPECT_EQ(describeMemory(limit), "this host has 16 GiB");
  EXPECT_EQ(formatBytes(1536), "1.5 KiB");
  EXPECT_EQ(formatBytes(80.0 * 1024 * 1024 * 1024 * 1024 * 1024), "80 PiB");
  EXPECT_GT(hostRamBytes(), 0.0);
  EXPECT_LE(memoryLimit().bytes, hostRamBytes());
}

// The real files: a child moved into a new cgroup with a 256 MiB limit reads that limit. Needs a
// writable memory cgroup (root, cgroup v1 memory controller or v2 with memory enabled).
TEST(MemoryLimit, AProcessInARealCgroupReadsItsLimit) {
  std::string made;
  for (const std::string& dir : detail::memoryCgroupDirs(test::readFile("/proc/self/cgroup"),
                                                          test::readFile("/proc/self/mountinfo"))) {
    const std::string child = dir + "/ddp_host_memory_test_" + std::to_string(::getpid());
    std::error_code error;  // not root, or /sys/fs/cgroup mounted read-only (docker): look on
    if (!fs::create_directory(child, error)) continue;
    const std::string file = fs::exists(child + "/memory.max") ? "/memory.max" : "/memory.limit_in_bytes";
    std::ofstream(child + file) << "268435456";
    if (test::readFile(child + file).rfind("268435456", 0) == 0) {
      made = child;
      break;
    }
    ::rmdir(child.c_str());
  }
  if (made.empty()) GTEST_SKIP() << "no writable memory cgroup here (not root, or the controller is not enabled)";
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::ofstream(made + "/cgroup.procs") << ::getpid();
    const MemoryLimit limit = memoryLimit();
    ::_exit(limit.bytes == 268435456.0 && limit.where.rfind(made, 0) == 0 ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::rmdir(made.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child in " << made << " did not read 256 MiB";
}

}  // namespace
}  // namespace ddp
