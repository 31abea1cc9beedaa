// Each tensor once: LibTorch's Module::parameters() lists a weight tied into two modules (a GPT's
// embedding and LM head, registered in both) under both names, where Python's model.parameters()
// yields it once.
#pragma once

#include <ATen/core/Tensor.h>

#include <unordered_set>
#include <vector>

namespace ddp::internal {

/// `tensors` without repeats (the same TensorImpl), in the order they first come.
inline std::vector<at::Tensor> distinctTensors(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  return out;
}

}  // namespace ddp::internal
