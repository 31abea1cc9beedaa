// The types of ddp::ProcessGroup's collectives (c10d's Types.hpp twin): the backend, the reduction,
// per-call options (a timeout, a label). Shared by the public front and the backends below it.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/enum_names.h"

namespace ddp {

/// How all-reduce and reduce-scatter combine the ranks' values (torch.distributed.ReduceOp).
enum class ReduceOp {
  kSum,
  kAvg,      ///< the sum divided by the group's size; floating-point tensors only (as NCCL's AVG)
  kProduct,
  kMin,
  kMax,
};

/// "sum", "avg", "product", "min", "max".
inline const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

/// Which collectives a group runs on (torch.distributed's backend names).
enum class Backend {
  kAuto,   ///< InitOptions: NCCL on GPUs, shm when every rank is on this host's CPUs, else Gloo
  kGloo,
  kNccl,
  kShm,    ///< our shared-memory collectives (one host, CPU)
  kLocal,  ///< ProcessGroup::backend() of a group of one (no network)
};

/// "auto", "gloo", "nccl", "shm", "local".
inline const char* backendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
    case Backend::kShm: return "shm";
    case Backend::kLocal: return "local";
  }
  return "?";
}

/// The backend a name (auto | gloo | nccl | shm) chooses; nullopt for any other (your own
/// option's error names it: InitOptions takes the enum).
inline std::optional<Backend> parseBackend(std::string_view name) {
  return detail::fromName(name, {Backend::kAuto, Backend::kGloo, Backend::kNccl, Backend::kShm}, backendName);
}

/// What every collective takes (all_gather, all_to_all, barrier, send, recv, ...).
struct CollectiveOptions {
  /// 0: the group's (InitOptions::timeout). Gloo and shm end this collective with a TimeoutError
  /// after it; on NCCL the host learns of it at waitForCollectives(), and at most the group's
  /// timeout applies (NCCL's watchdog aborts the process after that). Point-to-point and
  /// world-size-1 groups use the group's.
  std::chrono::milliseconds timeout{0};
  /// Names the collective in mismatch reports and the launcher's hang report
  /// ("all_reduce #812 (my loss)"); "" = unnamed. At most 55 characters are kept.
  std::string label;
};

/// all_reduce: `group.allReduce(t, ddp::ReduceOp::kMax)`, or fill the fields.
struct AllReduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
  AllReduceOptions() = default;
  AllReduceOptions(ReduceOp reduceOp) : op(reduceOp) {}  // NOLINT: implicit, as c10d's
};

/// reduce_scatter: rank r ends with the reduction over ranks of their inputs[r].
struct ReduceScatterOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
  ReduceScatterOptions() = default;
  ReduceScatterOptions(ReduceOp reduceOp) : op(reduceOp) {}  // NOLINT: implicit, as c10d's
};

/// broadcast: every rank ends with `root`'s values (`group.broadcast(t, 2)`).
struct BroadcastOptions : CollectiveOptions {
  int root = 0;
  BroadcastOptions() = default;
  BroadcastOptions(int rootRank) : root(rootRank) {}  // NOLINT: implicit, so broadcast(t, root) reads as before
};

}  // namespace ddp
