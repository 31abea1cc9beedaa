#include "ddp/clip_grad.h"

#include <ATen/ops/clamp.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "common/error.h"
#include "libddp/distinct_tensors.h"
#include "libddp/fsdp/sharded_parameter.h"

namespace ddp {

at::Tensor clipGradNorm(const std::vector<at::Tensor>& given, double maxNorm) {
  if (!(maxNorm > 0) || !std::isfinite(maxNorm)) {
    DDP_THROW(ConfigError, "ddp::clipGradNorm: maxNorm must be a positive finite number (got ", maxNorm, ")");
  }
  const std::vector<at::Tensor> params = internal::distinctTensors(given);  // a tied weight counts once
  for (const auto& p : params) {
    // A unit's rows on this rank: the norm of the rows would be this rank's part of the norm only.
    const auto shard = fsdp::shardOfParameter(p);
    if (shard && !shard->fullShape.empty() && shard->rows < shard->fullShape.front()) {
      DDP_THROW(ConfigError, "ddp::clipGradNorm: the parameters include rows of a ddp::fullyShard unit (", shard->unit,
                "), whose norm is over every rank's rows: call ddp::clipGradNorm(params, maxNorm, group)");
    }
  }
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return at::zeros({});
  // torch/nn/utils/clip_grad.py: the norm of the per-gradient norms, then one clamped coefficient
  // that multiplies every gradient (by 1.0 when the norm is within bounds).
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(at::linalg_vector_norm(g, 2.0));
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2.0);
  // Python's max_norm / (total + 1e-6) is Tensor.__rtruediv__: reciprocal, then the product.
  const at::Tensor coefficient = at::clamp((total + 1e-6).reciprocal() * maxNorm, c10::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coefficient.to(g.device()));
  return total;
}

}  // namespace ddp
