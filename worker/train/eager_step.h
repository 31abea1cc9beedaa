// The eager step: the step's micro-batches (forward and loss under autocast, backward; only the
// last one's backward communicates), the fp16 loss scale, clipping, the learning rate of the
// schedule, then the optimizer step — or, with a NaN or infinite gradient, the skip or the stop
// (on a GPU decided on the device and read at log steps).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "worker/train/train_step.h"

namespace ddp::worker {

class EagerStep : public TrainStep {
 public:
  explicit EagerStep(StepState& state) : s_(state), deviceChecks_(state.device.is_cuda()) {}
  int64_t run(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader,
              const StepPlace& place) override;
  void checkCounters() override;

 private:
  void scaledStep();
  void applyOrSkip(int64_t epoch);
  void deviceCheckedStep();

  StepState& s_;
  const bool deviceChecks_;    // on a GPU: the non-finite check stays on the device
  at::Tensor scalerSkips_;     // fp16: steps the scaler skipped, in all and in a row (device)
  int64_t skippedInARow_ = 0;  // host check: train.skip_nonfinite_steps
};

}  // namespace ddp::worker
