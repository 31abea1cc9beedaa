// How the Reducer (libddp/engine/reducer.h) groups parameters into all-reduce buckets: DDP's
// compute_bucket_assignment_by_size, in gradient-ready (reverse registration) order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace ddp::engine {

/// Buckets of parameter indices. Parameters are taken in reverse registration
/// order (backward produces the last layer's gradients first) and grouped by
/// dtype and device; a bucket closes as soon as it holds at least its cap in
/// bytes: `firstCapBytes` for the first bucket of each group, `capBytes` after.
/// Bucket 0 is the first to fill during backward.
std::vector<std::vector<size_t>> assignBuckets(const std::vector<at::Tensor>& params,
                                               size_t firstCapBytes, size_t capBytes);

}  // namespace ddp::engine
