// Who is missing after a collective timed out? Gloo and NCCL only say that a read timed out. Each
// rank whose collective times out signs in on the job's store and looks, for a short window, at
// who else signs in: a rank that never does is the one that stopped answering (stopped, hung,
// swapped out). The store calls run on a helper thread with a deadline, since the store's host
// may be that very rank; then the answer says so.
#pragma once

#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::comm {

/// In the census' answer when the store did not answer in time: its host (rank 0) left or is
/// stopped. Whoever reads the answer then knows the store cannot tell more.
inline constexpr char kStoreHostGone[] = "the store's host left or stopped";

class TimeoutCensus {
 public:
  TimeoutCensus(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds window);

  /// "missing: 2" / "missing: 1, 3"; "" when every rank signed in or no store is known. Blocks
  /// for at most the window plus one second (rank 0, which hosts the store, up to twice the window:
  /// it stays until the ranks that signed in after it have counted).
  std::string missingRanks() const;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds window_;
};

}  // namespace ddp::comm
