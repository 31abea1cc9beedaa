#include "worker/data/tensor_files.h"

#include <ATen/ops/min.h>

#include "common/error.h"
#include "ddp/state_dict.h"

namespace ddp::worker::data {
namespace {

std::string shapeOf(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

}  // namespace

TensorDataset loadTensorFile(const std::string& path, const std::string& key) {
  const std::string where = key + " '" + path + "'";
  const std::string expected = "; write it in Python with torch.save({\"x\": images, \"y\": labels}, path)";
  StateDict file;
  try {
    file = loadTensors(path);
  } catch (const CheckpointError& e) {
    // A file of something else than a dict: the library says so; the worker says which dict.
    const bool notADict = std::string(e.what()).find("not a dict of tensors") != std::string::npos;
    DDP_THROW(DataError, "data: ", key, ": ", e.what(), notADict ? expected : "");
  }
  const auto x = file.find("x");
  const auto y = file.find("y");
  if (x == file.end() || y == file.end()) {
    DDP_THROW(DataError, "data: ", where, " is not a dict with tensors 'x' and 'y'", expected);
  }
  at::Tensor images = x->second;
  at::Tensor labels = y->second;
  if (images.dim() < 2 || images.dim() > 4) {
    DDP_THROW(DataError, "data: ", where, ": x is ", shapeOf(images),
              "; give [N, C, H, W] images, [N, H, W] one-channel images or [N, F] feature vectors");
  }
  if (labels.dim() != 1 || !at::isIntegralType(labels.scalar_type(), /*includeBool=*/false)) {
    DDP_THROW(DataError, "data: ", where, ": y is ", shapeOf(labels), " of ", labels.scalar_type(),
              "; give class ids as a 1-D integer tensor (torch.long)");
  }
  if (images.size(0) != labels.size(0)) {
    DDP_THROW(DataError, "data: ", where, ": x holds ", images.size(0), " samples but y holds ", labels.size(0),
              " labels; they must have the same length");
  }
  labels = labels.to(at::kLong).contiguous();
  if (labels.numel() > 0 && at::min(labels).item<int64_t>() < 0) {
    DDP_THROW(DataError, "data: ", where, ": y holds the negative label ", at::min(labels).item<int64_t>(),
              "; class ids start at 0");
  }
  if (images.dim() == 3) images = images.unsqueeze(1);
  if (images.dim() == 2) images = images.reshape({images.size(0), 1, 1, images.size(1)});
  TensorDataset ds;
  if (images.scalar_type() == at::kByte) {
    ds.images = images.contiguous();
    ds.mean.assign(static_cast<size_t>(images.size(1)), 0.0f);
    ds.stddev.assign(static_cast<size_t>(images.size(1)), 1.0f);
  } else if (at::isFloatingType(images.scalar_type())) {
    ds.images = images.to(at::kFloat).contiguous();
  } else {
    DDP_THROW(DataError, "data: ", where, ": x is ", images.scalar_type(),
              "; give float images or features, or uint8 pixels");
  }
  ds.labels = labels;
  return ds;
}

}  // namespace ddp::worker::data
