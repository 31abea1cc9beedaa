// ddp::DdpOptions: how DistributedDataParallel reduces gradients (DDP's constructor arguments), and
// the choices among them as enums with their names (for a program's own flags). No LibTorch.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "ddp/enum_names.h"

namespace ddp {

class CommHook;

/// The dtype gradients travel in (DDP's fp16_compress_hook / bf16_compress_hook).
enum class GradientCompression { kNone, kFp16, kBf16 };
/// How gradients are all-reduced.
enum class GradientReducer {
  kBucketed,  ///< DDP's Reducer: buckets all-reduced as backward fills them, overlapped with it
  kFlat,      ///< one all-reduce of every gradient after backward
};

/// "none", "fp16", "bf16".
inline const char* compressionName(GradientCompression c) {
  return c == GradientCompression::kFp16 ? "fp16" : c == GradientCompression::kBf16 ? "bf16" : "none";
}
/// The compression a name (none | fp16 | bf16) chooses; nullopt for any other.
inline std::optional<GradientCompression> parseCompression(std::string_view name) {
  return detail::fromName(name, {GradientCompression::kNone, GradientCompression::kFp16, GradientCompression::kBf16},
                          compressionName);
}
/// "bucketed", "flat".
inline const char* reducerName(GradientReducer r) { return r == GradientReducer::kFlat ? "flat" : "bucketed"; }
/// The reducer a name (bucketed | flat) chooses; nullopt for any other.
inline std::optional<GradientReducer> parseReducer(std::string_view name) {
  return detail::fromName(name, {GradientReducer::kBucketed, GradientReducer::kFlat}, reducerName);
}

struct DdpOptions {
  double bucketCapMb = 25;            // like DDP's bucket_cap_mb
  double firstBucketCapMb = 1;        // a small first bucket starts communication early
  bool findUnusedParameters = false;  // parameters the forward did not reach count as ready
  bool broadcastBuffers = true;       // rank 0's buffers (BatchNorm statistics) before a forward that
                                      // follows a synchronising one (PyTorch's rule: under noSync, before
                                      // the first micro-batch only)
  bool gradientAsBucketView = false;  // .grad aliases the communication bucket (saves a copy)
  GradientCompression compression = GradientCompression::kNone;  // the dtype gradients travel in
  GradientReducer reducer = GradientReducer::kBucketed;            // DDP's Reducer, or one flat all-reduce
  /// How each bucket is reduced (register_comm_hook): allReduceHook(), fp16CompressHook(),
  /// bf16CompressHook(), powerSgdHook(...) or your own CommHook; null: the built-in all-reduce.
  std::shared_ptr<CommHook> commHook;
  /// static_graph=True: the set of parameters the forward uses never changes, so with
  /// findUnusedParameters the graph is searched and the used map all-reduced in the first
  /// synchronising backward only.
  bool staticGraph = false;
  /// A one-rank group runs the gradient sync too (buckets, all-reduces over the one rank), as
  /// PyTorch's DDP does at world size 1. Off: with one rank there is nothing to average, and the
  /// engine leaves the gradients alone.
  bool syncOnOneRank = false;
};

}  // namespace ddp
