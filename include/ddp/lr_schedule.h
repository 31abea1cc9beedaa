// ddp::LrSchedule: the learning rate of every optimizer step, by the formulas of PyTorch's
// schedulers (LibTorch has StepLR and ReduceLROnPlateau only): a linear warm-up (LinearLR), then
// constant, StepLR, cosine (CosineAnnealingLR) or linear decay (LinearLR), chained as SequentialLR
// chains them. A pure function of the step: a resumed run continues where it was.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/enum_names.h"

namespace torch::optim {
class Optimizer;
}

namespace ddp {

/// What follows the warm-up: constant, StepLR, CosineAnnealingLR or a linear decay (LinearLR).
enum class LrDecay { kConstant, kStep, kCosine, kLinear };

/// "constant", "step", "cosine", "linear".
inline const char* lrDecayName(LrDecay decay) {
  switch (decay) {
    case LrDecay::kConstant: return "constant";
    case LrDecay::kStep: return "step";
    case LrDecay::kCosine: return "cosine";
    case LrDecay::kLinear: return "linear";
  }
  return "?";
}
/// The decay a name (constant | step | cosine | linear) chooses; nullopt for any other.
inline std::optional<LrDecay> parseLrDecay(std::string_view name) {
  return detail::fromName(name, {LrDecay::kConstant, LrDecay::kStep, LrDecay::kCosine, LrDecay::kLinear}, lrDecayName);
}

struct LrScheduleOptions {
  LrDecay kind = LrDecay::kConstant;  // what follows the warm-up
  double baseLr = 0.1;            // the optimizer's lr
  int64_t warmupSteps = 0;        // steps 0..W-1 use baseLr·(k+1)/(W+1): PyTorch's
                                  // LinearLR(start_factor=1/(W+1), total_iters=W); then baseLr
  int64_t totalSteps = 0;         // cosine / linear: the step at which the decay reaches minLr (after
                                  // it, linear stays there and cosine rises again, as PyTorch's do,
                                  // unless holdMinLr)
  double minLr = 0;               // cosine: CosineAnnealingLR's eta_min; linear: the end value
  int64_t stepSize = 1;           // step: StepLR's step_size (steps after the warm-up)
  double gamma = 0.1;             // step: StepLR's gamma
  bool holdMinLr = false;         // cosine: minLr after totalSteps, as nanoGPT's get_lr (`if it >
                                  // lr_decay_iters: return min_lr`), not CosineAnnealingLR's rise
};

class LrSchedule {
 public:
  /// Throws ConfigError for a negative warm-up, a cosine or linear decay
  /// with totalSteps <= warmupSteps, stepSize < 1, a non-positive baseLr, or a linear decay to a
  /// minLr above baseLr (LinearLR's end_factor > 1).
  explicit LrSchedule(LrScheduleOptions options);

  /// The lr of optimizer step `step` (0-based: the lr the first update uses is at(0)); what
  /// optimizer.param_groups()[i]["lr"] holds in Python after `step` calls of scheduler.step().
  /// ConfigError for a negative step.
  double at(int64_t step) const;

  /// Sets every parameter group of `optimizer` to at(step); returns it.
  double apply(torch::optim::Optimizer& optimizer, int64_t step) const;

  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

}  // namespace ddp
