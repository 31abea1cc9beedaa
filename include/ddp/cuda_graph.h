// ddp::CudaGraph: torch.cuda.CUDAGraph with torch.cuda.graph's side stream, for LibTorch programs
// that link LibTorch's CPU half only (the CUDA half comes with libddp_cuda.so, loaded here).
//
//   ddp::CudaGraph graph(device);                     // a GPU of this process
//   std::unique_ptr<ddp::DistributedDataParallel> ddp;
//   graph.warmUp([&] { ddp = std::make_unique<ddp::DistributedDataParallel>(model, group); });
//   for (int i = 0; i < 3; ++i) graph.warmUp(step);   // eager, on the graph's stream: lazy inits, DDP's buckets
//   graph.capture(step);                              // recorded, not run
//   for (...) { staticInput.copy_(batch); graph.replay(); }
//
// `step` must touch the same tensors each time (static inputs, outputs, parameters, gradients,
// optimizer state) and read nothing on the host; its learning rate a device tensor
// (ddp::fusedSgdStep, ddp::FusedAdamW::step(..., lr)). NCCL collectives inside it (DDP's
// all-reduces) are captured too; ProcessGroupNCCL's watchdog does not see replayed collectives,
// so wait for a replay with finished() and a deadline before reading its results.
// Construct DDP (ddp::DistributedDataParallel, ddp::DdpEngine) inside warmUp(), as PyTorch asks DDP
// to be constructed in a side-stream context: its gradient accumulators keep the stream current at
// their creation, and backward runs them and the reducer's hooks there. Made on the default stream,
// the capture fails with "operation would make the legacy stream depend on a capturing blocking
// stream" (seen on an H200).
#pragma once

#include <c10/core/Device.h>

#include <functional>

namespace ddp {

class CudaGraph {
 public:
  /// ConfigError unless `device` is a CUDA device this build can use.
  explicit CudaGraph(c10::Device device);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// Runs `step` now, uncaptured, on the graph's side stream (PyTorch's advice: warm up there).
  void warmUp(const std::function<void()>& step);
  /// Captures `step` into the graph (its kernels are recorded, not run: replay() runs them).
  /// Error if a graph was captured already; an exception from `step` abandons the capture.
  void capture(const std::function<void()>& step);
  bool captured() const { return captured_; }
  /// Runs the captured graph on the current stream (Error before capture()).
  void replay();
  /// Whether the last replay has finished on the GPU (no wait).
  bool finished() const;

 private:
  void* handle_ = nullptr;
  bool captured_ = false;
};

}  // namespace ddp
