#include "worker/data/gather_batch.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>

#include "common/error.h"

namespace ddp::worker::data {

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

at::Tensor modelInput(const TensorDataset& dataset, const at::Tensor& rows) {
  if (dataset.mean.empty()) return rows;
  DDP_ENFORCE(rows.scalar_type() == at::kByte && rows.dim() >= 2 && rows.device().is_cpu(),
              "modelInput: normalised datasets hold uint8 [N, C, ...] images on the CPU");
  const int64_t channels = rows.size(1);
  DDP_ENFORCE(static_cast<int64_t>(dataset.mean.size()) == channels &&
                  dataset.stddev.size() == dataset.mean.size(),
              "modelInput: ", dataset.mean.size(), " channel means for images with ", channels, " channels");
  const at::Tensor in = rows.contiguous();
  at::Tensor out = at::empty(in.sizes(), at::kFloat);
  int64_t plane = 1;  // pixels per channel
  for (int64_t d = 2; d < in.dim(); ++d) plane *= in.size(d);
  const uint8_t* src = in.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  for (int64_t n = 0; n < in.size(0); ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      const float mean = dataset.mean[static_cast<size_t>(c)];
      const float stddev = dataset.stddev[static_cast<size_t>(c)];
      for (int64_t i = 0; i < plane; ++i, ++src, ++dst) {
        // The float32 operations of ToTensor + Normalize, in their order.
        *dst = (static_cast<float>(*src) / 255.0f - mean) / stddev;
      }
    }
  }
  return out;
}

Batch gatherBatch(const TensorDataset& dataset, const std::vector<int64_t>& indices) {
  return Batch{modelInput(dataset, gatherBatch(dataset.images, indices)), gatherBatch(dataset.labels, indices)};
}

Batch sliceBatch(const TensorDataset& dataset, int64_t begin, int64_t count) {
  return Batch{modelInput(dataset, dataset.images.narrow(0, begin, count)),
               dataset.labels.narrow(0, begin, count)};
}

}  // namespace ddp::worker::data
