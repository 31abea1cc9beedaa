// The memory this process may use: what the worker's "does it fit" checks compare a request with.
// The host's RAM, or less where a cgroup limits the job: a Kubernetes pod's limits.memory, Slurm's
// --mem (task/cgroup), docker --memory, a systemd slice's MemoryMax. A check against the RAM alone
// passes there and the job ends in the kernel's OOM kill instead of one line.
#pragma once

#include <string>
#include <vector>

namespace ddp {

struct MemoryLimit {
  double bytes = 0;  // 0: unknown (no check is made)
  std::string where;  // empty: the host's RAM; else the cgroup file that sets the limit
};

/// This host's physical memory in bytes (sysconf), 0 when unknown.
double hostRamBytes();

/// The least of the host's RAM and the memory limits of this process's cgroups and their parents
/// (cgroup v2 memory.max, v1 memory.limit_in_bytes); "max" and v1's unlimited are no limit.
MemoryLimit memoryLimit();

/// The host's memory as the checks use it: memoryLimit().bytes.
double hostMemoryBytes();

/// The end of a "does not fit" line: "this host has 23.5 GiB" or "this process may use 1 GiB (the
/// cgroup limit in /sys/fs/cgroup/.../memory.max)".
std::string describeMemory(const MemoryLimit& limit);

/// "23.5 GiB", "8.88 PiB": three digits in the largest unit that keeps the number >= 1.
std::string formatBytes(double bytes);

namespace detail {

/// The limit files of a process's memory cgroups, its own first, then each parent up to the
/// hierarchy's mount point: from /proc/self/cgroup's and /proc/self/mountinfo's texts, with `root`
/// put before every path (tests pass a directory of fake files; the real one is "").
std::vector<std::string> memoryLimitFiles(const std::string& procCgroup, const std::string& mountinfo,
                                          const std::string& root);

/// The least limit those files set (0: none), and the file that sets it.
MemoryLimit cgroupLimit(const std::vector<std::string>& files);

/// The directories of this process's memory cgroups (v2 and v1), for a test that makes a child.
std::vector<std::string> memoryCgroupDirs(const std::string& procCgroup, const std::string& mountinfo);

}  // namespace detail
}  // namespace ddp
