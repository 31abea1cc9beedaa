#include "comm/cuda_plugin.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <torch/version.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/error.h"

namespace ddp::comm {
namespace {

std::string programDirectory() {
  char path[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return ".";
  std::string p(path, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

// The directory of the file this code is in: the program, or an installed libddp.so (whose plugin
// lies beside it in lib/).
std::string ownDirectory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&programDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return programDirectory();
  }
  char resolved[PATH_MAX] = {};
  if (::realpath(info.dli_fname, resolved) == nullptr) return programDirectory();
  const std::string p(resolved);
  return p.substr(0, p.rfind('/'));
}

#ifdef DDP_CUDA_PLUGIN_PATH
// The directory each loaded copy of `library` ("libtorch_cpu.so") was mapped from.
std::vector<std::string> loadedFrom(const std::string& library) {
  struct Search {
    std::string name;
    std::vector<std::string> dirs;
  } search{"/" + library, {}};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        const std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
        const size_t at = path.rfind(s->name);
        // "libtorch_cpu.so" or a versioned "libtorch_cpu.so.2.5", not "libtorch_cpu_other.so".
        if (at != std::string::npos && (at + s->name.size() == path.size() || path[at + s->name.size()] == '.')) {
          char resolved[PATH_MAX] = {};
          const std::string real = ::realpath(path.c_str(), resolved) != nullptr ? resolved : path;
          s->dirs.push_back(real.substr(0, real.rfind('/')));
        }
        return 0;
      },
      &search);
  return search.dirs;
}

// Why the plugin at `path` does not belong to this program's LibTorch, or "".
std::string foreignLibTorch(const std::string& path, const CudaPlugin& plugin) {
  const std::string theirs = plugin.torchVersion != nullptr ? plugin.torchVersion : "unknown";
  if (theirs != TORCH_VERSION) {
    return path + " was built for LibTorch " + theirs + " and this program runs " + TORCH_VERSION;
  }
  const auto cpu = loadedFrom("libtorch_cpu.so"), cuda = loadedFrom("libtorch_cuda.so");
  if (cpu.size() == 1 && cuda.size() == 1 && cpu.front() != cuda.front()) {
    return path + " loaded " + cuda.front() + "/libtorch_cuda.so, but this program runs " + cpu.front() +
           "/libtorch_cpu.so (two LibTorch installations)";
  }
  return "";
}
#endif

}  // namespace

bool cudaPluginBuilt() {
#ifdef DDP_CUDA_PLUGIN_PATH
  return true;
#else
  return false;
#endif
}

const CudaPlugin& loadCudaPlugin() {
  static std::once_flag once;
  static CudaPlugin plugin;
  static std::string error;
  std::call_once(once, [] {
#ifdef DDP_CUDA_PLUGIN_PATH
    std::vector<std::string> candidates;
    if (const char* p = std::getenv("DDP_CUDA_PLUGIN"); p && *p) {
      candidates = {p};
    } else {
      candidates = {ownDirectory() + "/libddp_cuda.so", programDirectory() + "/libddp_cuda.so",
                    programDirectory() + "/../lib/libddp_cuda.so", DDP_CUDA_PLUGIN_PATH};
    }
    std::string reasons;
    for (const auto& path : candidates) {
      if (::access(path.c_str(), F_OK) != 0) continue;
      // RTLD_GLOBAL: libtorch_cuda and the CUDA libraries behave as if the program had linked them.
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (handle == nullptr) {
        reasons += std::string(reasons.empty() ? "" : "; ") + ::dlerror();
        continue;
      }
      using Entry = const CudaPlugin* (*)();
      auto entry = reinterpret_cast<Entry>(::dlsym(handle, kCudaPluginEntry));
      const CudaPlugin* p = entry ? entry() : nullptr;
      if (p == nullptr || p->abi != kCudaPluginAbi) {
        reasons += (reasons.empty() ? "" : "; ") + path + " is from another build (ABI mismatch)";
        continue;
      }
      if (const std::string foreign = foreignLibTorch(path, *p); !foreign.empty()) {
        // Loaded, but not used: its LibTorch is not ours (LibTorch's C++ ABI differs between builds).
        reasons += (reasons.empty() ? "" : "; ") + foreign;
        break;
      }
      plugin = *p;
      return;
    }
    error = "cannot load LibTorch's CUDA support (libddp_cuda.so): " +
            (reasons.empty() ? "not found beside the program or at " DDP_CUDA_PLUGIN_PATH : reasons) +
            "; rebuild, or set DDP_CUDA_PLUGIN to its path";
#else
    error = "this build's LibTorch has no CUDA; use device: cpu, or build against a CUDA LibTorch";
#endif
  });
  if (plugin.abi != kCudaPluginAbi) DDP_THROW(ConfigError, error);
  return plugin;
}

int driverGpuCount() {
  static const int count = [] {
    void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda == nullptr) return 0;
    using Init = int (*)(unsigned);
    using Count = int (*)(int*);
    auto init = reinterpret_cast<Init>(::dlsym(cuda, "cuInit"));
    auto getCount = reinterpret_cast<Count>(::dlsym(cuda, "cuDeviceGetCount"));
    int n = 0;
    // CUDA_SUCCESS is 0; CUDA_ERROR_NO_DEVICE (100) and the rest mean no usable GPU.
    if (init == nullptr || getCount == nullptr || init(0) != 0 || getCount(&n) != 0) return 0;
    return n;
  }();
  return count;
}

}  // namespace ddp::comm
