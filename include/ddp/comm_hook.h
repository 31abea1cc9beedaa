// Communication hooks: how DDP reduces a bucket of gradients (DistributedDataParallel's
// register_comm_hook and torch.distributed.algorithms.ddp_comm_hooks' twins): the built-in
// all-reduce, fp16/bf16 compression and PowerSGD, or a hook of your own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

/// One bucket of gradients as a hook gets it (torch.distributed.GradBucket). Buckets are numbered
/// in the order they are reduced; the last one of a backward says so.
class GradBucket {
 public:
  GradBucket(size_t index, bool isLast, at::Tensor buffer, std::vector<at::Tensor> gradients,
             std::vector<at::Tensor> parameters)
      : index_(index), isLast_(isLast), buffer_(std::move(buffer)), gradients_(std::move(gradients)),
        parameters_(std::move(parameters)) {}
  size_t index() const { return index_; }
  bool isLast() const { return isLast_; }
  /// This rank's gradients of the bucket, flat, in the parameters' dtype: the sum of its backwards
  /// since the last synchronising one, not divided by the world size. The hook leaves the mean
  /// over ranks here.
  at::Tensor& buffer() { return buffer_; }
  /// Views of buffer(), one per parameter, shaped as the parameters and with their strides when
  /// those are dense (a channels_last weight's view is channels_last: view() it only where
  /// is_contiguous()), as PyTorch's bucket views (bucket.gradients()).
  const std::vector<at::Tensor>& gradients() const { return gradients_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

 private:
  size_t index_;
  bool isLast_;
  at::Tensor buffer_;
  std::vector<at::Tensor> gradients_;
  std::vector<at::Tensor> parameters_;
};

/// How DDP reduces each bucket (a register_comm_hook hook and its state in one object). run() is
/// called during backward, on the autograd thread, once per bucket and in bucket order, as soon as
/// the bucket's gradients are in; the Work it returns is waited for, in bucket order, before
/// backward returns, and must leave the mean over ranks in bucket.buffer(). Every rank must start
/// the same collectives in the same order (a hook whose collectives depend on this rank's data
/// hangs the job). Pass it in ddp::DdpOptions::commHook or registerCommHook().
class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual Work run(GradBucket& bucket, ProcessGroup& group) = 0;
  /// For messages: "allreduce", "fp16", "powersgd", ...
  virtual std::string name() const { return "custom"; }
};

/// DDP's default: the bucket divided by the world size, then summed (allreduce_hook).
std::shared_ptr<CommHook> allReduceHook();
/// The bucket cast to float16 (bfloat16), divided by the world size, summed in that dtype and cast
/// back (fp16_compress_hook, bf16_compress_hook): half the bytes on the wire.
std::shared_ptr<CommHook> fp16CompressHook();
std::shared_ptr<CommHook> bf16CompressHook();

/// PowerSGDState's hyperparameters, with its defaults.
struct PowerSgdOptions {
  int64_t matrixApproximationRank = 1;  // rank r of the approximation M ≈ P Qᵀ (1-4 typical)
  int64_t startPowerSgdIter = 1000;     // plain all-reduce for the first iterations (≥ 2 with error
                                        // feedback or warm start)
  double minCompressionRate = 2;        // compress a matrix only when (n + m) r × rate < n m
  bool useErrorFeedback = true;         // add what compression lost last time to the next gradient
  bool warmStart = true;                // start from last step's Q instead of a random one
  double orthogonalizationEpsilon = 0;  // added to the column norms (e.g. 1e-8 against zero columns)
  uint32_t randomSeed = 0;              // the random Qs: numpy RandomState(seed) as PowerSGDState
  bool batchTensorsWithSameShape = false;  // one batched matmul per shape in a bucket
};

/// PowerSGD (powerSGD_hook, Vogels et al. 2019): every gradient viewed as an n×m matrix M with
/// (n + m) r × minCompressionRate < n m travels as P = M Q and Q = Mᵀ P (P orthogonalised between
/// the two all-reduces, Gram-Schmidt for r ≤ 2, QR above), the rest (biases, small layers) as one
/// plain all-reduce; M becomes P Qᵀ. The same arithmetic as PyTorch's hook, so the same seed and
/// gradients give the same result.
class PowerSgdHook final : public CommHook {
 public:
  explicit PowerSgdHook(PowerSgdOptions options = {});
  ~PowerSgdHook() override;
  Work run(GradBucket& bucket, ProcessGroup& group) override;
  std::string name() const override { return "powersgd"; }

  /// Iterations seen (a backward's last bucket ends one), as PowerSGDState.iter.
  int64_t iteration() const;
  /// Elements before and after compression over the compressed iterations so far, and their ratio
  /// (PowerSGDState.compression_stats()): what the hook saved on the wire.
  struct Stats {
    double rate = 0;
    int64_t elementsBefore = 0;
    int64_t elementsAfter = 0;
  };
  Stats compressionStats() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

std::shared_ptr<PowerSgdHook> powerSgdHook(PowerSgdOptions options = {});

}  // namespace ddp
