// The training loss of every model family the worker trains.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/functional/loss.h>

namespace ddp::worker {

/// Cross entropy of `output` against `labels`: a classifier's [N, C] logits and [N] class ids, or a
/// language model's [B, T, V] logits and [B, T] next tokens, averaged over every position (nanoGPT:
/// F.cross_entropy(logits.view(-1, V), targets.view(-1))).
inline at::Tensor lossOf(const at::Tensor& output, const at::Tensor& labels) {
  if (output.dim() == 3) {
    return torch::nn::functional::cross_entropy(output.reshape({-1, output.size(2)}), labels.reshape({-1}));
  }
  return torch::nn::functional::cross_entropy(output, labels);
}

}  // namespace ddp::worker
