#include "libddp/fsdp/shard_layout.h"

#include <algorithm>

namespace ddp::fsdp {

std::vector<int64_t> ParamLayout::localShape() const {
  std::vector<int64_t> shape = fullShape;
  shape[0] = localRows;
  return shape;
}

ShardLayout::ShardLayout(const std::vector<std::vector<int64_t>>& shapes, int world, int rank)
    : world_(world), rank_(rank) {
  for (const auto& shape : shapes) {
    ParamLayout p;
    p.fullShape = shape;
    p.rows = shape.front();
    p.rowNumel = 1;
    for (size_t d = 1; d < shape.size(); ++d) p.rowNumel *= shape[d];
    // torch.chunk(tensor, world, dim=0): chunks of ceil(rows / world) rows, the last ones shorter or absent.
    p.chunkRows = (p.rows + world - 1) / world;
    p.localRows = std::clamp<int64_t>(p.rows - rank * p.chunkRows, 0, p.chunkRows);
    p.offset = shardNumel_;
    shardNumel_ += p.paddedNumel();
    params_.push_back(std::move(p));
  }
}

at::Tensor ShardLayout::shardView(const at::Tensor& shardFlat, size_t i) const {
  const ParamLayout& p = params_[i];
  return shardFlat.narrow(0, p.offset, p.localRows * p.rowNumel).view(p.localShape());
}

at::Tensor ShardLayout::fullView(const at::Tensor& fullFlat, size_t i) const {
  const ParamLayout& p = params_[i];
  std::vector<int64_t> padded = p.fullShape;
  padded[0] = p.chunkRows * world_;
  return fullFlat.narrow(0, p.offset * world_, p.paddedNumel() * world_).view(padded).narrow(0, 0, p.rows);
}

at::Tensor ShardLayout::shardViewInFull(const at::Tensor& fullFlat, size_t i) const {
  const ParamLayout& p = params_[i];
  return fullFlat.narrow(0, p.offset * world_ + rank_ * p.paddedNumel(), p.localRows * p.rowNumel).view(p.localShape());
}

void ShardLayout::copyShard(const at::Tensor& full, const at::Tensor& shardFlat, size_t i) const {
  const ParamLayout& p = params_[i];
  if (p.localRows == 0 || p.rowNumel == 0) return;
  const int64_t numel = p.localRows * p.rowNumel;
  shardFlat.narrow(0, p.offset, numel).copy_(full.reshape({-1}).narrow(0, rank_ * p.chunkRows * p.rowNumel, numel));
}

void ShardLayout::copyOut(const std::vector<at::Tensor>& gathered, const at::Tensor& fullFlat) const {
  for (const ParamLayout& p : params_) {
    if (p.paddedNumel() == 0) continue;
    const at::Tensor full = fullFlat.narrow(0, p.offset * world_, p.paddedNumel() * world_);
    for (int r = 0; r < world_; ++r) {
      full.narrow(0, r * p.paddedNumel(), p.paddedNumel())
          .copy_(gathered[r].reshape({-1}).narrow(0, p.offset, p.paddedNumel()));
    }
  }
}

void ShardLayout::packGradient(const at::Tensor& grad, const at::Tensor& input, size_t i) const {
  const ParamLayout& p = params_[i];
  if (p.paddedNumel() == 0) return;
  // (world, S) narrowed to the parameter's columns, viewed as (world, chunkRows, rowNumel).
  at::Tensor dst = input.narrow(1, p.offset, p.paddedNumel()).view({world_, p.chunkRows, p.rowNumel});
  if (!grad.defined()) {
    dst.zero_();
    return;
  }
  const at::Tensor src = grad.contiguous().view({p.rows, p.rowNumel});
  const int64_t whole = p.rows / p.chunkRows;  // ranks whose chunk is full
  if (whole > 0) dst.narrow(0, 0, whole).copy_(src.narrow(0, 0, whole * p.chunkRows).view({whole, p.chunkRows, p.rowNumel}));
  if (whole < world_) {
    const int64_t rest = p.rows - whole * p.chunkRows;
    at::Tensor part = dst.select(0, whole);
    if (rest > 0) part.narrow(0, 0, rest).copy_(src.narrow(0, whole * p.chunkRows, rest));
    part.narrow(0, rest, p.chunkRows - rest).zero_();
    if (whole + 1 < world_) dst.narrow(0, whole + 1, world_ - whole - 1).zero_();
  }
}

}  // namespace ddp::fsdp
