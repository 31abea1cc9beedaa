// Activation checkpointing for the C++ frontend: PyTorch's torch.utils.checkpoint.checkpoint and
// checkpoint_sequential, which LibTorch lacks (pytorch/pytorch#52744). A block's forward keeps none
// of its activations, only its input; backward runs the block again to make them. Memory for
// compute: one more forward per block, activations of one block at a time instead of all.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace torch::nn {
class Module;
class SequentialImpl;
}  // namespace torch::nn

namespace ddp {

struct ActivationCheckpointOptions {
  /// torch.utils.checkpoint's preserve_rng_state: the recompute draws the same random numbers as
  /// the forward did (dropout masks): the CPU generator and the input's GPU's are set to their state
  /// at the forward, and given back after. Off: cheaper, and dropout differs between the two.
  bool preserveRngState = true;
};

/// `fn(input)`, keeping only `input` for backward, where `fn` runs again under the same autocast
/// state and random-number state (torch.utils.checkpoint.checkpoint(fn, input)). `owner` is the
/// module whose parameters `fn` uses: their gradients come out of this call's node, so DDP's
/// hooks, findUnusedParameters, fullyShard units and gradient accumulation see them as without
/// checkpointing; a parameter `fn` uses outside `owner` is a ConfigError at backward (its gradient
/// would be lost), not a silent zero. `owner`'s buffers (BatchNorm statistics) are put back after
/// the recompute, so they are updated once per forward, as without checkpointing (PyTorch's
/// checkpoint updates them twice). `owner` and what `fn` captures must outlive the backward.
///
/// Without grad mode (evaluation), or with nothing that requires grad, it is `fn(input)`.
/// Gradients are those of `fn(input)` to the bit where `fn`'s kernels are deterministic (CPU).
/// A SyncBatchNorm inside `fn` would all-reduce again in backward: not supported.
at::Tensor activationCheckpoint(torch::nn::Module& owner, const std::function<at::Tensor(const at::Tensor&)>& fn,
                                const at::Tensor& input, const ActivationCheckpointOptions& options = {});

/// torch.utils.checkpoint.checkpoint_sequential(sequential, segments, input): the modules cut into
/// `segments` runs of size()/segments modules (the last takes the rest); every run but the last is
/// checkpointed. ConfigError when segments < 1 or exceeds the number of modules.
at::Tensor activationCheckpointSequential(torch::nn::SequentialImpl& sequential, int64_t segments,
                                          const at::Tensor& input, const ActivationCheckpointOptions& options = {});

}  // namespace ddp
