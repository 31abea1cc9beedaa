#include "launcher/nvml.h"

#include <dlfcn.h>

#include "common/error.h"

namespace ddp::launcher {
namespace {

// The few NVML types and calls we use, as nvml.h declares them (ABI stable since NVML 5;
// the _v2/_v3 entry points are what nvml.h maps the plain names to).
using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = void*;
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};

template <typename Fn>
Fn symbol(void* lib, const char* name) {
  auto fn = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (fn == nullptr) DDP_THROW(Error, "NVML (libnvidia-ml.so.1) has no ", name, "; update the NVIDIA driver");
  return fn;
}

}  // namespace

std::optional<std::vector<GpuInfo>> queryGpus(std::string* why) {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    if (why != nullptr) *why = std::string("NVML is not installed (") + ::dlerror() + "): no NVIDIA driver on this host";
    return std::nullopt;
  }
  const auto init = symbol<nvmlReturn_t (*)()>(lib, "nvmlInit_v2");
  const auto shutdown = symbol<nvmlReturn_t (*)()>(lib, "nvmlShutdown");
  const auto errorString = symbol<const char* (*)(nvmlReturn_t)>(lib, "nvmlErrorString");
  const auto getCount = symbol<nvmlReturn_t (*)(unsigned*)>(lib, "nvmlDeviceGetCount_v2");
  const auto getHandle = symbol<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(lib, "nvmlDeviceGetHandleByIndex_v2");
  const auto getName = symbol<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(lib, "nvmlDeviceGetName");
  const auto getUuid = symbol<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(lib, "nvmlDeviceGetUUID");
  const auto getPci = symbol<nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*)>(lib, "nvmlDeviceGetPciInfo_v3");
  const auto getMemory = symbol<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>(lib, "nvmlDeviceGetMemoryInfo");
  const auto getUtil = symbol<nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*)>(lib, "nvmlDeviceGetUtilizationRates");

  auto check = [&](nvmlReturn_t rc, const char* what) {
    if (rc != 0) DDP_THROW(Error, "NVML ", what, " failed: ", errorString(rc));
  };
  check(init(), "initialisation");
  std::vector<GpuInfo> table;
  try {
    unsigned count = 0;
    check(getCount(&count), "device count");
    constexpr unsigned long long kMiB = 1024ull * 1024ull;
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice_t device = nullptr;
      check(getHandle(i, &device), "device handle");
      GpuInfo g;
      g.index = static_cast<int>(i);
      char text[96] = {};
      check(getName(device, text, sizeof text), "device name");
      g.name = text;
      char uuid[96] = {};
      check(getUuid(device, uuid, sizeof uuid), "device UUID");
      g.uuid = uuid;
      nvmlPciInfo_t pci{};
      check(getPci(device, &pci), "PCI info");
      g.pciBusId = pci.busId;
      nvmlMemory_t memory{};
      check(getMemory(device, &memory), "memory info");
      g.totalMiB = memory.total / kMiB;
      g.usedMiB = memory.used / kMiB;
      g.freeMiB = memory.free / kMiB;
      nvmlUtilization_t util{};
      // Not every GPU reports utilisation (e.g. with MIG enabled): unknown, not an error.
      if (getUtil(device, &util) == 0) g.utilizationPercent = static_cast<int>(util.gpu);
      table.push_back(std::move(g));
    }
  } catch (...) {
    shutdown();
    throw;
  }
  shutdown();
  return table;
}

}  // namespace ddp::launcher
