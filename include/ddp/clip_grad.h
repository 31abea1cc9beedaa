// ddp::clipGradNorm: torch.nn.utils.clip_grad_norm_ for LibTorch programs, meant for the gradients
// DDP has just averaged (so the norm, and the clipping, are the same on every rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace ddp {

/// The L2 norm of all gradients of `params` taken together (parameters without a gradient are
/// skipped); when it exceeds `maxNorm` every gradient is scaled by maxNorm / (norm + 1e-6), as
/// PyTorch's clip_grad_norm_(params, max_norm) does (same kernels, same order: equal bits on the
/// CPU). Returns the norm before clipping as a 0-dim tensor where the gradients live: reading it
/// (item()) waits for a GPU, so read it at log steps only. A non-finite norm, as in PyTorch
/// (error_if_nonfinite=False): NaN makes every gradient NaN; infinity makes the coefficient 0, so
/// an infinite element becomes NaN and every finite one 0 (finite gradients whose norm overflows
/// float32 become zeros, all finite: check the returned norm too before stepping). A tensor listed twice counts once (a
/// weight tied into two modules, which LibTorch's parameters() lists under both names where
/// Python's model.parameters() yields it once). Throws ConfigError for maxNorm <= 0,
/// and for rows of a ddp::fullyShard unit (their norm needs the group: the overload in
/// <ddp/fully_shard.h>).
at::Tensor clipGradNorm(const std::vector<at::Tensor>& params, double maxNorm);

}  // namespace ddp
