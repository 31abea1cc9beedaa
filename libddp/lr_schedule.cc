#include "ddp/lr_schedule.h"

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace ddp {

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  if (!parseLrDecay(lrDecayName(o.kind))) {
    DDP_THROW(ConfigError, "ddp::LrScheduleOptions::kind is ", static_cast<int>(o.kind), ", not an LrDecay");
  }
  if (!(o.baseLr > 0) || !std::isfinite(o.baseLr)) {
    DDP_THROW(ConfigError, "ddp::LrScheduleOptions::baseLr must be a positive finite number (got ", o.baseLr, ")");
  }
  if (o.warmupSteps < 0) DDP_THROW(ConfigError, "ddp::LrScheduleOptions::warmupSteps must be >= 0 (got ", o.warmupSteps, ")");
  if ((o.kind == LrDecay::kCosine || o.kind == LrDecay::kLinear) && o.totalSteps <= o.warmupSteps) {
    DDP_THROW(ConfigError, "ddp::LrSchedule: a ", lrDecayName(o.kind), " decay needs totalSteps (", o.totalSteps,
              ") > warmupSteps (", o.warmupSteps, "): the warm-up would take the whole run");
  }
  if (o.kind == LrDecay::kStep && o.stepSize < 1) DDP_THROW(ConfigError, "ddp::LrScheduleOptions::stepSize must be >= 1 (got ", o.stepSize, ")");
  if (!(o.minLr >= 0) || !std::isfinite(o.minLr)) {
    DDP_THROW(ConfigError, "ddp::LrScheduleOptions::minLr must be a finite number >= 0 (got ", o.minLr, ")");
  }
  if (o.kind == LrDecay::kLinear && o.minLr > o.baseLr) {
    DDP_THROW(ConfigError, "ddp::LrSchedule: a linear decay from baseLr ", o.baseLr, " to minLr ", o.minLr,
              " would rise (LinearLR's end_factor must be <= 1); give a minLr <= baseLr");
  }
  if (!(o.gamma > 0) || !std::isfinite(o.gamma)) {
    DDP_THROW(ConfigError, "ddp::LrScheduleOptions::gamma must be a positive finite number (got ", o.gamma, ")");
  }
}

double LrSchedule::at(int64_t step) const {
  if (step < 0) DDP_THROW(ConfigError, "ddp::LrSchedule::at(", step, "): the step counts optimizer steps from 0");
  const auto& o = options_;
  const int64_t w = o.warmupSteps;
  if (step < w) {
    // LinearLR(start_factor=s, total_iters=W) at k: base·(s + (1 - s)·k/W), s = 1/(W+1).
    const double s = 1.0 / static_cast<double>(w + 1);
    return o.baseLr * (s + (1.0 - s) * static_cast<double>(step) / static_cast<double>(w));
  }
  const int64_t k = step - w;  // steps since the warm-up ended (SequentialLR restarts the next one at 0)
  if (o.kind == LrDecay::kStep) {
    return o.baseLr * std::pow(o.gamma, static_cast<double>(k / o.stepSize));
  }
  if (o.kind == LrDecay::kCosine) {
    // CosineAnnealingLR(T_max = total - W, eta_min) in closed form (past T_max it rises again, as
    // PyTorch's does).
    if (o.holdMinLr && k >= o.totalSteps - w) return o.minLr;
    const double t = static_cast<double>(k) / static_cast<double>(o.totalSteps - w);
    return o.minLr + (o.baseLr - o.minLr) * (1.0 + std::cos(M_PI * t)) / 2.0;
  }
  if (o.kind == LrDecay::kLinear) {
    // LinearLR(start_factor=1, end_factor=minLr/base, total_iters = total - W).
    const double t = static_cast<double>(std::min(k, o.totalSteps - w)) / static_cast<double>(o.totalSteps - w);
    return o.baseLr * (1.0 + (o.minLr / o.baseLr - 1.0) * t);
  }
  return o.baseLr;
}

double LrSchedule::apply(torch::optim::Optimizer& optimizer, int64_t step) const {
  const double lr = at(step);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
  return lr;
}

}  // namespace ddp
