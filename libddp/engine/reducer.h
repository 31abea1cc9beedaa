// DDP's gradient Reducer: per-parameter autograd hooks fill flat buckets, and a
// bucket's asynchronous all-reduce starts as soon as its last gradient is in,
// overlapping communication with the rest of backward
// (torch/csrc/distributed/c10d/reducer.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "libddp/torch_compat.h"
#include "ddp/comm_hook.h"
#include "ddp/process_group.h"
#include "libddp/engine/gradient_sync.h"

namespace ddp::engine {

/// The dtype gradients travel in. Buckets stay in the parameters' dtype.
enum class WireDtype { kNone, kFp16, kBf16 };

struct ReducerOptions {
  size_t bucketCapBytes = 25u << 20;      // like DDP's bucket_cap_mb=25
  size_t firstBucketCapBytes = 1u << 20;  // DDP's smaller first bucket: communication starts early
  bool findUnusedParameters = false;      // mark parameters the graph does not reach as ready
  bool gradientAsBucketView = false;      // .grad aliases the bucket (no copy back)
  WireDtype compression = WireDtype::kNone;
  bool staticGraph = false;  // findUnusedParameters: the first backward's used set holds for all
};

/// Averages gradients over the group's ranks during backward.
///
/// Per step (DDP's contract): call prepareForBackward(outputs) right before the
/// backward whose gradients must be averaged; when that backward returns, every
/// parameter's .grad holds the mean over ranks. Backwards run without
/// prepareForBackward (gradient accumulation, DDP's no_sync) only accumulate
/// locally. Every rank must hold the same parameters in the same order.
class Reducer final : public GradientSync {
 public:
  /// Its collectives go through `group` (the DDP engine's is labelled "DDP gradients"), and so do a
  /// hook's.
  Reducer(ProcessGroup group, std::vector<at::Tensor> params, std::vector<std::string> names,
          ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Arms the hooks for the next backward. `outputs` are the tensors backward
  /// starts from (the loss); with findUnusedParameters the graph behind them is
  /// searched for parameters it does not reach. Throws CommError when the
  /// previous armed backward never completed its reduction.
  void prepareForBackward(const std::vector<at::Tensor>& outputs) override;

  /// Replaces the built-in all-reduce; before the first synchronising backward only (throws
  /// ConfigError after it, or for a second hook).
  void setHook(std::shared_ptr<CommHook> hook);

  /// Join (uneven inputs), on a rank out of batches: the collectives of one synchronising backward
  /// of the others, with zeros (every bucket through the hook or the built-in all-reduce, then the
  /// unused-parameter map), this rank's gradients untouched.
  void shadowBackward();
  /// A rank with no batch for a synchronising step (uneven shards every rank knows): every bucket
  /// reduced from the .grad tensors as they are (zeros where undefined: nothing was used here),
  /// then finalised as a backward is, so each .grad ends as the mean over ranks. Throws
  /// CommError while an armed backward has not finished.
  void reduceWithoutBackward() override;
  /// Join with divideByInitialWorldSize = false: the next backward's built-in all-reduce divides
  /// by `divisor` (the ranks still training) instead of the world size.
  void setNextDivisor(double divisor);

  /// zero_grad for the parameters: a bucket whose every defined .grad is its view (gradient as
  /// bucket view) is zeroed with one kernel, any other .grad on its own; undefined ones stay so.
  /// Not while an armed backward runs (CommError).
  void zeroGrad();

  /// Parameter indices per bucket, in launch order.
  const std::vector<std::vector<size_t>>& bucketIndices() const { return layout_; }

  /// Seconds the last reduction spent waiting for all-reduces after backward
  /// (communication not hidden behind backward).
  double lastWaitSeconds() const { return lastWaitSeconds_; }

 private:
  struct Bucket {
    std::vector<size_t> params;     // indices into params_, in bucket order
    at::Tensor buffer;              // flat, the parameters' dtype
    at::Tensor wire;                // compressed copy for the wire (or undefined)
    std::vector<at::Tensor> views;  // per parameter: its slice of `buffer`, shaped like it
    size_t pending = 0;             // gradients still missing this backward
    std::optional<Work> work;       // launched, not yet waited for
  };
  struct Slot {
    size_t bucket = 0;
    size_t indexInBucket = 0;
    compat::GradAccumulatorPtr accumulator;  // kept alive: it owns our hook
    uintptr_t hookKey = 0;
    bool ready = false;
  };

  void onGradientReady(size_t index);
  void markReadyLocked(size_t index);
  void markUnusedReadyLocked();
  void launchReadyBucketsLocked();
  void finalizeBackward();
  std::string describeMissingLocked() const;

  ProcessGroup group_;
  ProcessGroup hookGroup_;  // what a hook gets: a handle of its own, so a hook cannot disturb group_
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  ReducerOptions options_;
  std::vector<std::vector<size_t>> layout_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  std::vector<size_t> unused_;  // this backward's parameters the graph does not reach
  at::Tensor usedMap_;          // findUnusedParameters: 1 where this rank produced a gradient
  std::shared_ptr<CommHook> hook_;
  std::string hookName_;
  bool reducedOnce_ = false;   // a synchronising backward has completed (static graph, setHook)
  bool staticUsedKnown_ = false;  // staticGraph: usedMap_ holds the first backward's global map
  double nextDivisor_ = 0;        // > 0: the divisor of the next backward (Join)

  std::mutex mutex_;
  bool armed_ = false;          // prepared, reduction not finished yet
  bool hookSeen_ = false;       // a hook fired since prepareForBackward
  size_t nextBucket_ = 0;       // next bucket to launch; launched strictly in order
  double lastWaitSeconds_ = 0;
};

}  // namespace ddp::engine
