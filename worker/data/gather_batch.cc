#include "worker/data/gather_batch.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>

#include "common/error.h"

namespace ddp::data {

at::Tensor gatherBatch(const at::Tensor& t, const std::vector<int64_t>& indices) {
  DDP_ENFORCE(t.defined() && t.dim() >= 1, "gatherBatch needs a tensor with a batch dimension");
  const int64_t rows = t.size(0);
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= rows) {
      DDP_THROW(DataError, "gatherBatch: index ", indices[i], " (position ", i,
                ") is outside the dataset [0, ", rows, ")");
    }
  }
  // from_blob only borrows `indices`; index_select copies before we return.
  at::Tensor index = at::from_blob(const_cast<int64_t*>(indices.data()),
                                   {static_cast<int64_t>(indices.size())}, at::kLong);
  if (t.device() != index.device()) {
    index = index.to(t.device());  // index_select wants both on one device
  }
  return at::index_select(t, 0, index);
}

Batch gatherBatch(const TensorDataset& dataset, const std::vector<int64_t>& indices) {
  return Batch{gatherBatch(dataset.images, indices), gatherBatch(dataset.labels, indices)};
}

}  // namespace ddp::data
