// Many tensors as one contiguous buffer, so that they cost one collective (the multi-tensor
// broadcast, the flat gradient all-reduce). No comm/ here: libddp/engine/ uses it too.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <cstdint>
#include <vector>

namespace ddp::flat {

/// The tensors' elements one after another (their dtypes promoted to a common one, as at::cat).
inline at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

/// Copies `buffer` back into the tensors, in flatten()'s order.
inline void unflatten(const at::Tensor& buffer, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(buffer.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
}

}  // namespace ddp::flat
