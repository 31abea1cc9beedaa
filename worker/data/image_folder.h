// torchvision's ImageFolder layout decoded into memory: root/train/<class>/*.png|jpg,
// root/test/<class>/..., listed by the library (ddp::ImageDataset::folder: torchvision's order,
// linked folders followed) and decoded by it (libpng, libjpeg-turbo: what Pillow uses).
#pragma once

#include <ddp/image_data.h>

#include <cstdint>
#include <vector>

#include "worker/data/tensor_dataset.h"

namespace ddp::worker::data {

struct ImageFolderOptions {
  int64_t resize = 0;           // > 0: every image resized to resize x resize (bilinear, antialiased)
  std::vector<float> mean = {0, 0, 0};    // per channel (RGB), after x / 255 (Normalize)
  std::vector<float> stddev = {1, 1, 1};
  int threads = 1;              // images decoded in parallel
  int64_t maxPixels = ddp::kMaxImagePixels;  // ddp::ImageDecodeOptions::maxPixels
};

/// Every sample of `set` decoded to RGB (as ImageFolder's loader: Image.convert("RGB")), uint8
/// [N, 3, H, W] in the set's order, labels the set's. Without resize every image must have the
/// first one's size. Throws ddp::DataError naming the file for an unreadable or undecodable image
/// or a size mismatch.
TensorDataset loadImageFolderSplit(const ddp::ImageDataset& set, const ImageFolderOptions& options);

}  // namespace ddp::worker::data
