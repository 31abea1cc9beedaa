/// @file
/// Who arrives last at the gradient all-reduce. A rank that reaches DDP's gradient collectives
/// late (slow data loading, a slower GPU, a noisy neighbour) makes every other rank wait for it
/// in them; the rank that arrives last waits least. Each rank measures, per step since the previous
/// look, how long the last of its collectives with one label ("DDP gradients": the DDP wrapper's
/// buckets) took: started when its backward ended, it ends when the last rank's has. The flight
/// recorder the process group keeps anyway has the times; one all-gather of three numbers per
/// rank tells every rank the others'. Python has no counterpart in PyTorch
/// (nvidia-resiliency-ext's straggler detection is one).
#pragma once

#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

/// What StragglerMonitor::measure() found over the collectives since the previous call.
struct StragglerReport {
  std::vector<double> medianWaitS;  ///< per rank: median time in the labelled collectives (s)
  std::vector<double> p95WaitS;     ///< per rank: their 95th percentile (s)
  int straggler = -1;               ///< the rank that waits least, i.e. arrives last; -1: no samples
  double skewS = 0;                 ///< the other ranks' median wait (median over them) minus the straggler's
  int samples = 0;                  ///< steps this rank measured (the last collective of each)
};

/// Measures, at points every rank reaches together (a logged step), who arrives last.
class StragglerMonitor {
 public:
  /// `label`: the collectives to time; "DDP gradients" are DistributedDataParallel's buckets.
  explicit StragglerMonitor(ProcessGroup group, std::string label = "DDP gradients");

  /// A collective (an all-gather): every rank of the group calls it at the same point. In a group
  /// of one it returns an empty report without communicating.
  StragglerReport measure();

 private:
  ProcessGroup group_;
  std::string label_;
  uint64_t seenWrites_ = 0;  // the recorder's entries already looked at
};

}  // namespace ddp
