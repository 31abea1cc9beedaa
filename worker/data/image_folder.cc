#include "worker/data/image_folder.h"

#include <ATen/ops/_upsample_bilinear2d_aa.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ddp/image_data.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>

#include "common/error.h"

namespace ddp::worker::data {

TensorDataset loadImageFolderSplit(const ddp::ImageDataset& set, const ImageFolderOptions& options) {
  // Decode (and resize) in parallel; each image lands in its own row.
  const int64_t n = set.size();
  std::vector<ddp::RgbImage> decoded(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  ddp::ImageDecodeOptions decode;
  decode.maxPixels = options.maxPixels;
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) {
      try {
        const std::vector<uint8_t> bytes = set.read(i);
        decoded[static_cast<size_t>(i)] = ddp::decodeImage(bytes.data(), bytes.size(), set.name(i), decode);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, options.threads); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const auto& e : errors) {
    if (!e.empty()) throw DataError(e);
  }

  const int64_t h = options.resize > 0 ? options.resize : decoded.front().height;
  const int64_t w = options.resize > 0 ? options.resize : decoded.front().width;
  TensorDataset ds;
  ds.images = at::empty({n, 3, h, w}, at::kByte);
  ds.labels = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const ddp::RgbImage& img = decoded[static_cast<size_t>(i)];
    ds.labels.data_ptr<int64_t>()[i] = set.label(i);
    at::Tensor chw = at::from_blob(const_cast<uint8_t*>(img.pixels.data()), {img.height, img.width, 3}, at::kByte)
                         .permute({2, 0, 1});
    if (options.resize > 0) {
      // torchvision's Resize on tensors: bilinear, antialias, align_corners=False, rounded back to uint8.
      const at::Tensor f = chw.unsqueeze(0).to(at::kFloat);
      chw = at::_upsample_bilinear2d_aa(f, {h, w}, /*align_corners=*/false).squeeze(0).round().clamp(0, 255).to(at::kByte);
    } else if (img.height != h || img.width != w) {
      DDP_THROW(DataError, "data: image '", set.name(i), "' is ", img.width, "x", img.height,
                " but '", set.name(0), "' is ", w, "x", h, "; set data.image_size to resize them all");
    }
    ds.images[i].copy_(chw);
  }
  ds.mean = options.mean;
  ds.stddev = options.stddev;
  return ds;
}

}  // namespace ddp::worker::data
