// ddp::Join: training with uneven inputs, torch.distributed.algorithms.Join's twin for the DDP
// engine. A rank that runs out of batches keeps answering the others' collectives (its gradients
// count as zeros) until every rank is done; then the last rank to finish gives its model to all.
#pragma once

#include "ddp/distributed_data_parallel.h"

namespace ddp {

class ZeroRedundancyOptimizer;

struct JoinOptions {
  bool enable = true;                   // false: the context does nothing (Join(..., enable=False))
  bool throwOnEarlyTermination = false; // every rank throws ddp::Error as soon as one runs out
  bool divideByInitialWorldSize = true; // gradients divided by the world size (the joined ranks' zeros
                                        // included, PyTorch's default); false: by the ranks still training
};

/// `{ ddp::Join join(model); for (batch : myShare) { step } }` (`with Join([model]):`): while it
/// lives, each forward through the model tells the other ranks this rank is still training (one
/// one-element all-reduce, and one more before the backward's buckets); its destructor (or
/// finish()) runs the joined rank's side: per step of the others, the same collectives with zeros
/// (buffers broadcast from the highest rank still training, every bucket through the model's
/// communication hook, the unused-parameter map), until all have finished; then the highest of
/// the last ranks to finish broadcasts its parameters and buffers, so every replica ends equal.
/// The optimizer of a joined rank takes no steps; its momentum stays as it was (as in PyTorch).
///
/// With a ddp::ZeroRedundancyOptimizer, whose step() is collective (each rank broadcasts its
/// shard), give it too: `ddp::Join join(model, zero);` (`with Join([model, zero]):`). Per step of
/// the others the joined rank then takes the step's reduced gradients (its own counted as zeros,
/// as backwardWithoutBatch() does) and steps its shard with them, so every shard, the joined
/// rank's included, follows the ranks still training exactly. (PyTorch's ZeRO join hook steps with
/// whatever gradients the joined rank holds; its docs ask the user to set them.) Without it, the
/// others' ZeRO broadcasts meet the Join's collectives: shm names the mismatch, Gloo times out.
class Join {
 public:
  explicit Join(DdpEngine& engine, JoinOptions options = {});
  Join(DdpEngine& engine, ZeroRedundancyOptimizer& optimizer, JoinOptions options = {});
  template <typename Model>
  explicit Join(DistributedDataParallel<Model>& model, JoinOptions options = {}) : Join(model.engine(), options) {}
  template <typename Model>
  Join(DistributedDataParallel<Model>& model, ZeroRedundancyOptimizer& optimizer, JoinOptions options = {})
      : Join(model.engine(), optimizer, options) {}
  /// finish() when it was not called and no exception is leaving the scope (then nothing is sent:
  /// the other ranks meet the failure at their collectives' timeout). Throws what finish() throws.
  ~Join() noexcept(false);
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  /// This rank has no more batches: shadows the others' steps until every rank is here, then syncs
  /// the final model. Collective. With throwOnEarlyTermination, throws ddp::Error on every rank.
  void finish();

 private:
  DdpEngine& engine_;
  ZeroRedundancyOptimizer* optimizer_ = nullptr;  // stepped per shadowed step, when given
  JoinOptions options_;
  int uncaught_;
  bool finished_ = false;
};

}  // namespace ddp
