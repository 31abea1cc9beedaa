// The defaults of the Parallelism interface (worker/train/parallelism.h): what a mode with
// replicated parameters and gradients (ddp, single, dp) does; train.sharding full overrides them.
#include "worker/train/parallelism.h"

#include <c10/core/GradMode.h>

#include "common/error.h"
#include "ddp/clip_grad.h"
#include "worker/models/models.h"
#include "worker/train/finite_check.h"

namespace ddp::worker {

void Parallelism::backwardWithoutBatch(bool) {
  DDP_THROW(Error, "train.uneven_inputs join: this mode has no ranks to join (it is for mode ddp)");
}

// Keeps each .grad tensor (it may alias a reducer bucket); zeroes it in place.
void Parallelism::zeroGrad(const std::vector<at::Tensor>& params) {
  c10::NoGradGuard noGrad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().zero_();
  }
}

void Parallelism::describeMemory(TrainResult& result) {
  for (const auto& p : module().parameters()) {
    result.parameterBytes += static_cast<int64_t>(p.numel() * p.element_size());
    if (p.grad().defined()) result.gradientBytes += static_cast<int64_t>(p.grad().numel() * p.grad().element_size());
  }
}

at::Tensor Parallelism::clipGradients(const std::vector<at::Tensor>& params, double maxNorm) {
  return clipGradNorm(params, maxNorm);
}

bool Parallelism::allFiniteOnEveryRank(const std::vector<at::Tensor>& tensors) { return allFinite(tensors); }

StateDict Parallelism::exportState(bool writer) { return writer ? modelStateDict(module()) : StateDict(); }

StateDict Parallelism::rankState() { return stateDict(module()); }

}  // namespace ddp::worker
