// Test accuracy over a whole data set, split across ranks without overlap.
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>

#include <functional>

#include "ddp/process_group.h"
#include "worker/data/batch_loader.h"
#include "worker/data/sample_source.h"

namespace ddp::worker {

struct EvalCounts {
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const { return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
};

/// Rank r counts the contiguous slice [n·r/R, n·(r+1)/R); the counts are summed
/// over ranks, so every sample is counted exactly once. Collective: all ranks call it.
/// `loading` (threads, pinning) makes the batches; its device is set to `device`.
EvalCounts evaluate(torch::nn::AnyModule& model, const data::SampleSource& test, c10::Device device,
                    int64_t batchSize, ProcessGroup& group, data::LoaderOptions loading = {});

/// The same through `forward` on `module` (in eval mode), whose forward is a collective (a fully
/// sharded model): every rank runs as many forwards as the rank with the most batches, its missing
/// ones on `filler` (counted nowhere).
EvalCounts evaluateCollective(const std::function<at::Tensor(const at::Tensor&)>& forward, torch::nn::Module& module,
                              const at::Tensor& filler, const data::SampleSource& test, c10::Device device,
                              int64_t batchSize, ProcessGroup& group, data::LoaderOptions loading = {});

}  // namespace ddp::worker
