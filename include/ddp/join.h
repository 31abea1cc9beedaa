// ddp::Join: training with uneven inputs, torch.distributed.algorithms.Join's twin for the DDP
// engine. A rank that runs out of batches keeps answering the others' collectives (its gradients
// count as zeros) until every rank is done; then the last rank to finish gives its model to all.
#pragma once

#include "ddp/distributed_data_parallel.h"

namespace ddp {

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
class Join {
 public:
  explicit Join(DdpEngine& engine, JoinOptions options = {});
  template <typename Model>
  explicit Join(DistributedDataParallel<Model>& model, JoinOptions options = {}) : Join(model.engine(), options) {}
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
  JoinOptions options_;
  int uncaught_;
  bool finished_ = false;
};

}  // namespace ddp
