// DdpEngine's state, shared by its sources (ddp_engine.cc, join.cc). Not installed.
#pragma once

#include <ATen/ops/full.h>

#include <memory>
#include <optional>
#include <vector>

#include "common/error.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/join.h"
#include "libddp/engine/gradient_sync.h"
#include "libddp/engine/reducer.h"

namespace ddp {

struct DdpEngine::State {
  explicit State(ProcessGroup g) : group(std::move(g)), bufferBroadcast(group.withLabel("DDP buffer broadcast")) {}
  ProcessGroup group;
  ProcessGroup bufferBroadcast;  // the group, its collectives named for reports
  std::vector<at::Tensor> buffers;
  bool syncBuffers = false;
  // PyTorch DDP's require_forward_param_sync: the last forward was one whose backward communicates
  // (or there was none yet), so the next forward starts from rank 0's buffers. Inside no_sync that
  // is the first micro-batch's forward only.
  bool requireForwardParamSync = true;
  bool warnedRankZeroWithoutBatch = false;  // backwardWithoutBatch's buffer warning, once
  std::unique_ptr<engine::GradientSync> gradientSync;  // none for a group of one
  engine::Reducer* reducer = nullptr;                  // gradientSync when bucketed
  bool flat = false;
  std::vector<at::Tensor> params;
  bool broadcastBuffers = true;
  // ddp::Join: set while a Join context is active and enabled.
  std::optional<JoinOptions> join;

  // The highest rank whose `mine` is true (DDP's _find_common_rank: a MAX all-reduce of the rank,
  // or -1 where `mine` is false).
  static int commonRank(ProcessGroup& group, bool mine) {
    at::Tensor rank = at::full({1}, mine ? group.rank() : -1, at::TensorOptions(at::kInt).device(group.collectiveDevice()));
    group.allReduce(rank, ReduceOp::kMax);
    const int common = rank.item<int>();
    if (common < 0) {
      DDP_THROW(CommError, "ddp::Join: no rank qualified as the source of the model (ranks disagree about who joined)");
    }
    return common;
  }
  // One element all-reduced: the sum over ranks of `value`.
  static double sumOver(ProcessGroup& group, double value) {
    at::Tensor t = at::full({1}, value, at::TensorOptions(at::kFloat).device(group.collectiveDevice()));
    group.allReduce(t);
    return t.item<double>();
  }
};

}  // namespace ddp
