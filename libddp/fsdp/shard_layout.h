// Where each parameter of a fully sharded unit lives in the unit's two flat buffers (FSDP2's
// padding, torch/distributed/fsdp/_fully_shard/_fsdp_param.py): dim 0 is chunked into `world`
// pieces as torch.chunk does, each padded to ceil(dim0 / world) rows; a rank past the end holds
// zero rows. The shard buffer is this rank's padded chunks one after the other (the all-gather's
// input, S elements); the full buffer holds each parameter's padded full tensor contiguously
// (world * S elements), so a parameter's full data is one view of it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ddp::fsdp {

struct ParamLayout {
  std::vector<int64_t> fullShape;
  int64_t rows = 0;        // dim 0 of the full parameter
  int64_t rowNumel = 0;    // elements per row (the product of the other dims)
  int64_t chunkRows = 0;   // ceil(rows / world): every rank's padded rows
  int64_t localRows = 0;   // this rank's unpadded rows (0 past the end)
  int64_t offset = 0;      // where its padded chunk starts in the shard buffer
  int64_t paddedNumel() const { return chunkRows * rowNumel; }
  std::vector<int64_t> localShape() const;  // FSDP2's local shard shape: {localRows, rest...}
};

class ShardLayout {
 public:
  ShardLayout() = default;
  /// `shapes`: the full parameters' shapes (at least one dimension each).
  ShardLayout(const std::vector<std::vector<int64_t>>& shapes, int world, int rank);

  size_t size() const { return params_.size(); }
  const ParamLayout& operator[](size_t i) const { return params_[i]; }
  int world() const { return world_; }
  int64_t shardNumel() const { return shardNumel_; }  // S
  int64_t fullNumel() const { return shardNumel_ * world_; }

  /// Parameter i's unpadded local shard inside the flat shard buffer.
  at::Tensor shardView(const at::Tensor& shardFlat, size_t i) const;
  /// Parameter i's full tensor inside the flat full buffer.
  at::Tensor fullView(const at::Tensor& fullFlat, size_t i) const;
  /// This rank's rows of parameter i inside the flat full buffer (its unpadded local shard there).
  at::Tensor shardViewInFull(const at::Tensor& fullFlat, size_t i) const;
  /// Copies this rank's rows of `full` (parameter i's full value) into its shard.
  void copyShard(const at::Tensor& full, const at::Tensor& shardFlat, size_t i) const;
  /// The all-gather's copy-out: gathered[r] is rank r's shard buffer (S elements), copied as it
  /// is (no (world, S) stack of them first: one copy per element, as FSDP2's split_with_sizes_copy).
  void copyOut(const std::vector<at::Tensor>& gathered, const at::Tensor& fullFlat) const;
  /// The reduce-scatter's copy-in: parameter i's full gradient (undefined: zeros) into row r of
  /// `input` (world, S) as rank r's padded chunk.
  void packGradient(const at::Tensor& grad, const at::Tensor& input, size_t i) const;
  /// Parameter i's sharded gradient inside the reduce-scatter's output (S elements).
  at::Tensor shardOfOutput(const at::Tensor& output, size_t i) const { return shardView(output, i); }

 private:
  std::vector<ParamLayout> params_;
  int world_ = 1;
  int rank_ = 0;
  int64_t shardNumel_ = 0;
};

}  // namespace ddp::fsdp
