// DataParallel: one process drives several replicas of one master module, like
// torch.nn.DataParallel. Each forward scatters the batch along dim 0, runs the
// replicas in parallel (one thread each), and gathers the outputs on the output
// device. The gathered output is connected to the master's parameters by one
// autograd node, so any loss on it and one backward() leave the gradient of the
// whole batch in the master's .grad: every replica's backward runs in parallel
// and the replica gradients are summed into the master in replica order.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>

#include <memory>
#include <vector>

namespace ddp::worker::dp {

struct DataParallelOptions {
  // Where the replicas run; devices[0] must hold the master's parameters.
  // The same device may repeat only for CPU (N replicas on N threads).
  std::vector<c10::Device> devices = {c10::Device(c10::kCPU)};
  // Where outputs are gathered (and the loss is computed); unset = devices[0].
  c10::optional<c10::Device> outputDevice;
  int intraOpThreadsPerReplica = 1;  // LibTorch intra-op threads in each replica thread (0 = default)
};

/// The sizes scatter() gives a batch of `batch` rows over `replicas` replicas: torch.chunk's, as
/// nn.DataParallel's scatter: parts of ceil(batch / replicas) rows, the last the rest, and no empty
/// part (so fewer parts than replicas where the rows run out). 10 over 4 → {3, 3, 3, 1}; 9 over 4 →
/// {3, 3, 3}; 2 over 4 → {1, 1}.
std::vector<int64_t> scatterSizes(int64_t batch, int64_t replicas);

class DataParallel {
 public:
  /// `master` stays the one model that owns the parameters (optimise and export
  /// it); throws ddp::ConfigError if its parameters are not on devices[0].
  DataParallel(torch::nn::AnyModule master, const DataParallelOptions& options);
  ~DataParallel();

  /// Output of the master on `input` (any device; rows along dim 0), on the output
  /// device. With grad mode on, backward from it accumulates into the master's .grad.
  /// One replica on the master's device, gathering there: the master itself runs, as
  /// nn.DataParallel with one device calls its module (no replica, no second backward).
  at::Tensor forward(const at::Tensor& input);

  const std::vector<c10::Device>& devices() const;
  c10::Device outputDevice() const;
  /// Replicas used by the last forward (fewer than devices() for a batch smaller than that).
  int lastReplicasUsed() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddp::worker::dp
