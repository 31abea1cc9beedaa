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
  // Decoded in parallel a chunk at a time, each image resized into its row and freed before the next
  // chunk: memory holds the kept (resized) images and one chunk at full size. (Decoding every image
  // first held the whole set at full size: 490 MB of 200 x 200 JPEGs for 10 MB kept at 32 x 32, where
  // data.stream auto had judged the set by its kept size.)
  const int64_t n = set.size();
  if (n == 0) DDP_THROW(DataError, "data: an image folder split holds no images");
  const int threads = std::max(1, options.threads);
  const int64_t chunk = int64_t{16} * threads;
  ddp::ImageDecodeOptions decode;
  decode.maxPixels = options.maxPixels;
  TensorDataset ds;
  int64_t h = 0, w = 0;
  std::vector<ddp::RgbImage> decoded;
  std::vector<std::string> errors;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    decoded.assign(static_cast<size_t>(end - begin), ddp::RgbImage{});
    errors.assign(static_cast<size_t>(end - begin), std::string());
    std::atomic<int64_t> next{begin};
    auto work = [&] {
      for (int64_t i = next++; i < end; i = next++) {
        try {
          const std::vector<uint8_t> bytes = set.read(i);
          decoded[static_cast<size_t>(i - begin)] = ddp::decodeImage(bytes.data(), bytes.size(), set.name(i), decode);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(i - begin)] = e.what();
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < std::min<int64_t>(threads, end - begin); ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (const auto& e : errors) {  // the first bad image in the set's order
      if (!e.empty()) throw DataError(e);
    }
    if (begin == 0) {
      h = options.resize > 0 ? options.resize : decoded.front().height;
      w = options.resize > 0 ? options.resize : decoded.front().width;
      ds.images = at::empty({n, 3, h, w}, at::kByte);
      ds.labels = at::empty({n}, at::kLong);
    }
    for (int64_t i = begin; i < end; ++i) {
      ddp::RgbImage& img = decoded[static_cast<size_t>(i - begin)];
      ds.labels.data_ptr<int64_t>()[i] = set.label(i);
      at::Tensor chw = at::from_blob(img.pixels.data(), {img.height, img.width, 3}, at::kByte).permute({2, 0, 1});
      if (options.resize > 0) {
        // torchvision's Resize on tensors: bilinear, antialias, align_corners=False, rounded back to uint8.
        const at::Tensor f = chw.unsqueeze(0).to(at::kFloat);
        chw = at::_upsample_bilinear2d_aa(f, {h, w}, /*align_corners=*/false).squeeze(0).round().clamp(0, 255).to(at::kByte);
      } else if (img.height != h || img.width != w) {
        DDP_THROW(DataError, "data: image '", set.name(i), "' is ", img.width, "x", img.height,
                  " but '", set.name(0), "' is ", w, "x", h, "; set data.image_size to resize them all");
      }
      ds.images[i].copy_(chw);
      img = ddp::RgbImage{};  // its full-size pixels freed now
    }
  }
  ds.mean = options.mean;
  ds.stddev = options.stddev;
  return ds;
}

}  // namespace ddp::worker::data
