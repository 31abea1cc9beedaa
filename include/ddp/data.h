// One copy of a data set per host: the first rank of each host loads it into shared memory and
// the other ranks of that host map the same pages read-only (a data set of N GB costs N GB per
// host, not N GB per rank). Call it from InitOptions::beforeGroup.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

/// What a loader hands to loadOncePerHost(): the tensors to share (CPU, any dtype and strides) and
/// whatever else the other ranks need to use them (e.g. a normalisation, a shape), as text.
struct HostData {
  std::vector<at::Tensor> tensors;
  std::string meta;
};

/// How this process came by its copy.
enum class HostCopyOrigin {
  kLoaded,                // this process loaded the data itself (a host with one rank)
  kSharedByThisRank,      // this rank loaded it for its host
  kMappedFromHostCopy,    // mapped read-only from the copy another rank of the host loaded
  kLoadedAfterMapFailed,  // the copy could not be mapped here (another pid namespace, /proc with
                          // hidepid): loaded in this process, with a warning
};

struct HostCopy {
  std::vector<at::Tensor> tensors;  // in load()'s order; read-only views when shared (writing into
                                    // them is a segmentation fault)
  std::string meta;                 // load()'s meta
  HostCopyOrigin origin = HostCopyOrigin::kLoaded;
};

/// The first rank of this host to ask runs `load`; its tensors go into a sealed anonymous memory file
/// (nothing with a name in a file system: the memory is gone with the last process that holds it)
/// and every other rank of the host maps it, after checking it is that copy. Ranks of a host are
/// told apart from other hosts' by hostname and boot id; `name` keeps several data sets apart. If
/// `load` throws, every rank of the host throws the same error (same class: ConfigError, DataError or
/// Error, same line) instead of waiting. Collective over the ranks of a host; with one rank on the
/// host it just calls `load`.
HostCopy loadOncePerHost(const GroupStart& start, const std::function<HostData()>& load,
                         const std::string& name = "data");

}  // namespace ddp
