// This host's physical memory: what the worker's "does it fit" checks compare a request with.
#pragma once

#include <unistd.h>

namespace ddp {

/// This host's physical memory in bytes (sysconf), 0 when unknown.
inline double hostMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long pageSize = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && pageSize > 0 ? static_cast<double>(pages) * static_cast<double>(pageSize) : 0;
}

}  // namespace ddp
