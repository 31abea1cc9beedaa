// ddp::Join: DDP's join hook for uneven inputs (torch.distributed.algorithms.Join).
#include "ddp/join.h"

#include <c10/core/GradMode.h>

#include <exception>
#include <vector>

#include "common/error.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "libddp/engine/engine_state.h"
#include "libddp/internal.h"

namespace ddp {

Join::Join(DdpEngine& engine, JoinOptions options)
    : engine_(engine), options_(options), uncaught_(std::uncaught_exceptions()) {
  DdpEngine::State& state = *engine_.state_;
  internal::checkLive(state.group, "ddp::Join");
  if (state.join) DDP_THROW(ConfigError, "ddp::Join: this model is in a Join already; one Join at a time");
  if (!options_.enable) return;
  if (state.flat) {
    DDP_THROW(ConfigError, "ddp::Join shadows the buckets of the bucketed reducer; ddp::DdpOptions::reducer is flat");
  }
  state.join = options_;
}

Join::Join(DdpEngine& engine, ZeroRedundancyOptimizer& optimizer, JoinOptions options) : Join(engine, options) {
  optimizer_ = &optimizer;
}

Join::~Join() noexcept(false) {
  DdpEngine::State& state = *engine_.state_;
  if (finished_ || std::uncaught_exceptions() != uncaught_) {
    state.join.reset();
    return;
  }
  finish();
}

// Join.__exit__ with DDP's join hook: per step of the ranks still training, "how many still
// train?" then the step's collectives with zeros; at the end the last joiner's model for all.
void Join::finish() {
  DdpEngine::State& state = *engine_.state_;
  if (finished_) return;
  finished_ = true;
  state.join.reset();
  if (!options_.enable || !state.gradientSync) return;  // disabled, or a group of one
  internal::checkLive(state.group, "ddp::Join");
  ProcessGroup group = state.group.withLabel("Join: joined rank");
  bool lastJoiner = true;
  while (DdpEngine::State::sumOver(group, 0) > 0) {
    if (options_.throwOnEarlyTermination) {
      DdpEngine::State::sumOver(group, 1);  // the others' check: someone ran out
      DDP_THROW(Error, "ddp::Join: rank ", group.rank(), " ran out of inputs first; every rank stops here "
                "(ddp::JoinOptions::throwOnEarlyTermination)");
    }
    if (state.requireForwardParamSync && state.syncBuffers) {
      const int root = DdpEngine::State::commonRank(group, false);
      group.broadcast(state.buffers, root);
    }
    const bool sync = DdpEngine::State::sumOver(group, 0) > 0;
    state.requireForwardParamSync = sync;
    if (sync && optimizer_ != nullptr) {
      // ZeRO's step is collective: this rank steps its shard with the step's reduced gradients,
      // its own counted as zeros (the same collectives as shadowBackward's, results kept).
      {
        c10::NoGradGuard noGrad;
        for (const at::Tensor& p : state.params) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
      }
      state.reducer->reduceWithoutBackward();
      optimizer_->step();
    } else if (sync) {
      state.reducer->shadowBackward();
    }
    lastJoiner = false;
  }
  const int root = DdpEngine::State::commonRank(group, lastJoiner);
  std::vector<at::Tensor> model = state.params;
  if (state.broadcastBuffers) model.insert(model.end(), state.buffers.begin(), state.buffers.end());
  c10::NoGradGuard noGrad;
  group.broadcast(model, root);
}

}  // namespace ddp
