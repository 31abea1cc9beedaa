#include "common/host_memory.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ddp {
namespace {

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> splitWords(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

bool hasItem(const std::string& commaList, const std::string& item) {
  std::istringstream in(commaList);
  for (std::string part; std::getline(in, part, ',');) {
    if (part == item) return true;
  }
  return false;
}

// The cgroup path of /proc/self/cgroup's line for hierarchy v2 ("0::/path") or for v1's memory
// controller ("4:memory:/path"); empty when there is none.
std::string cgroupPath(const std::string& procCgroup, bool v2) {
  std::istringstream in(procCgroup);
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    if (v2 ? (line.substr(0, first) == "0" && controllers.empty()) : hasItem(controllers, "memory")) {
      return line.substr(second + 1);
    }
  }
  return {};
}

struct CgroupMount {
  std::string root;        // the path in the hierarchy that is mounted
  std::string mountPoint;
  bool v2 = false;
};

// mountinfo: "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS".
std::vector<CgroupMount> memoryMounts(const std::string& mountinfo) {
  std::vector<CgroupMount> mounts;
  std::istringstream in(mountinfo);
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> w = splitWords(line);
    size_t dash = 0;
    while (dash < w.size() && w[dash] != "-") ++dash;
    if (dash < 5 || dash + 1 >= w.size()) continue;
    const std::string& type = w[dash + 1];
    const std::string superOptions = dash + 3 < w.size() ? w[dash + 3] : "";
    if (type == "cgroup2") mounts.push_back({w[3], w[4], true});
    if (type == "cgroup" && hasItem(superOptions, "memory")) mounts.push_back({w[3], w[4], false});
  }
  return mounts;
}

// The directory of `path` under a mount of the hierarchy's `root`; the mount point itself when
// the path lies outside what is mounted (a container that sees only its own part).
std::string cgroupDir(const CgroupMount& mount, const std::string& path) {
  const std::string& root = mount.root;
  std::string relative;
  if (root == "/") {
    relative = path == "/" ? "" : path;
  } else if (path.compare(0, root.size(), root) == 0 && (path.size() == root.size() || path[root.size()] == '/')) {
    relative = path.substr(root.size());
  }
  return mount.mountPoint + relative;
}

// This process's memory cgroups, one per hierarchy directory (a hierarchy mounted twice is one).
struct MemoryCgroup {
  std::string dir;
  std::string mountPoint;
  bool v2 = false;
};

std::vector<MemoryCgroup> memoryCgroups(const std::string& procCgroup, const std::string& mountinfo) {
  std::vector<MemoryCgroup> cgroups;
  for (const CgroupMount& mount : memoryMounts(mountinfo)) {
    const std::string path = cgroupPath(procCgroup, mount.v2);
    if (path.empty() || path[0] != '/') continue;
    const std::string dir = cgroupDir(mount, path);
    bool seen = false;
    for (const auto& c : cgroups) seen = seen || c.dir == dir;
    if (!seen) cgroups.push_back({dir, mount.mountPoint, mount.v2});
  }
  return cgroups;
}

}  // namespace

double hostRamBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long pageSize = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && pageSize > 0 ? static_cast<double>(pages) * static_cast<double>(pageSize) : 0;
}

namespace detail {

std::vector<std::string> memoryCgroupDirs(const std::string& procCgroup, const std::string& mountinfo) {
  std::vector<std::string> dirs;
  for (const MemoryCgroup& cgroup : memoryCgroups(procCgroup, mountinfo)) dirs.push_back(cgroup.dir);
  return dirs;
}

std::vector<std::string> memoryLimitFiles(const std::string& procCgroup, const std::string& mountinfo,
                                          const std::string& root) {
  std::vector<std::string> files;
  for (const MemoryCgroup& cgroup : memoryCgroups(procCgroup, mountinfo)) {
    const char* name = cgroup.v2 ? "/memory.max" : "/memory.limit_in_bytes";
    // A limit set on a parent (a Kubernetes pod, a Slurm job above its step) binds its children too.
    for (std::string dir = cgroup.dir;; dir = dir.substr(0, dir.rfind('/'))) {
      files.push_back(root + dir + name);
      if (dir.size() <= cgroup.mountPoint.size() || dir.rfind('/') == std::string::npos) break;
    }
  }
  return files;
}

MemoryLimit cgroupLimit(const std::vector<std::string>& files) {
  MemoryLimit least;
  for (const std::string& file : files) {
    std::istringstream in(readText(file));
    std::string value;
    if (!(in >> value) || value == "max") continue;
    char* end = nullptr;
    const double bytes = std::strtod(value.c_str(), &end);
    // v1's "unlimited" is PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages): no limit.
    if (end == value.c_str() || *end != '\0' || bytes <= 0 || bytes >= 0x1p62) continue;
    if (least.bytes == 0 || bytes < least.bytes) least = MemoryLimit{bytes, file};
  }
  return least;
}

}  // namespace detail

MemoryLimit memoryLimit() {
  const MemoryLimit ram{hostRamBytes(), ""};
  const MemoryLimit cgroup = detail::cgroupLimit(
      detail::memoryLimitFiles(readText("/proc/self/cgroup"), readText("/proc/self/mountinfo"), ""));
  if (cgroup.bytes > 0 && (ram.bytes <= 0 || cgroup.bytes < ram.bytes)) return cgroup;
  return ram;
}

double hostMemoryBytes() { return memoryLimit().bytes; }

std::string formatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < sizeof units / sizeof units[0]) {
    bytes /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.3g %s", bytes, units[unit]);
  return text;
}

std::string describeMemory(const MemoryLimit& limit) {
  if (limit.where.empty()) return "this host has " + formatBytes(limit.bytes);
  return "this process may use " + formatBytes(limit.bytes) + " (the cgroup limit in " + limit.where + ")";
}

}  // namespace ddp
