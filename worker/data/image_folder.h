// torchvision's ImageFolder layout: root/train/<class>/*.png|jpg, root/test/<class>/..., classes
// the sorted folder names; PNG through libpng, JPEG through libjpeg-turbo (what Pillow uses).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "worker/data/tensor_dataset.h"

namespace ddp::worker::data {

struct ImageFolderOptions {
  int64_t resize = 0;           // > 0: every image resized to resize x resize (bilinear, antialiased)
  std::vector<float> mean = {0, 0, 0};    // per channel (RGB), after x / 255 (Normalize)
  std::vector<float> stddev = {1, 1, 1};
  int threads = 1;              // images decoded in parallel
  int64_t maxPixels = 2 * 89478485;  // ddp::ImageDecodeOptions::maxPixels
};

/// One split: every file under root/<split>/<class>/ (sorted by name) decoded to RGB (as
/// ImageFolder's loader: Image.convert("RGB")), uint8 [N, 3, H, W], labels = the class's index in
/// `classes`. Without resize every image must have the first one's size. Throws ddp::DataError
/// naming the file for an unreadable or undecodable image, a size mismatch, or a class folder
/// without images.
TensorDataset loadImageFolderSplit(const std::string& splitDir, const std::vector<std::string>& classes,
                                   const ImageFolderOptions& options);

/// The class names of a split: its sub-directories, sorted. Throws DataError when none.
std::vector<std::string> imageFolderClasses(const std::string& splitDir);

/// Decodes one PNG or JPEG file to RGB bytes (height * width * 3, row-major, interleaved).
struct DecodedImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> rgb;
};
DecodedImage decodeImage(const std::string& path, int64_t maxPixels);

}  // namespace ddp::worker::data
