#include "worker/data/image_folder.h"

#include <ATen/ops/_upsample_bilinear2d_aa.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ddp/image_data.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>

#include "common/error.h"

namespace ddp::worker::data {
namespace {

namespace fs = std::filesystem;

bool isImageFile(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

}  // namespace

DecodedImage decodeImage(const std::string& path, int64_t maxPixels) {
  // The library's decoder (TurboJPEG, libpng): the bytes of Pillow's convert("RGB"), as streamed images get.
  ddp::ImageDecodeOptions options;
  options.maxPixels = maxPixels;
  ddp::RgbImage image = ddp::decodeImageFile(path, options);
  return {image.height, image.width, std::move(image.pixels)};
}

std::vector<std::string> imageFolderClasses(const std::string& splitDir) {
  std::error_code ec;
  if (!fs::is_directory(splitDir, ec)) {
    DDP_THROW(DataError, "data: '", splitDir, "' is not a directory; data.root needs train/<class>/ and test/<class>/ "
              "folders of PNG or JPEG images (torchvision's ImageFolder layout)");
  }
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(splitDir)) {
    if (entry.is_directory()) classes.push_back(entry.path().filename().string());
  }
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) DDP_THROW(DataError, "data: '", splitDir, "' has no class folders (<class>/image.png)");
  return classes;
}

TensorDataset loadImageFolderSplit(const std::string& splitDir, const std::vector<std::string>& classes,
                                   const ImageFolderOptions& options) {
  std::vector<std::pair<std::string, int64_t>> files;  // path, label
  for (size_t c = 0; c < classes.size(); ++c) {
    const fs::path dir = fs::path(splitDir) / classes[c];
    std::vector<std::string> mine;
    std::error_code ec;
    if (fs::is_directory(dir, ec)) {
      for (const auto& entry : fs::recursive_directory_iterator(dir)) {
        if (entry.is_regular_file() && isImageFile(entry.path())) mine.push_back(entry.path().string());
      }
    }
    if (mine.empty()) {
      DDP_THROW(DataError, "data: class folder '", dir.string(), "' has no .png/.jpg/.jpeg images; every class needs some");
    }
    std::sort(mine.begin(), mine.end());
    for (auto& f : mine) files.emplace_back(std::move(f), static_cast<int64_t>(c));
  }

  // Decode (and resize) in parallel; each image lands in its own row.
  const auto n = static_cast<int64_t>(files.size());
  std::vector<DecodedImage> decoded(files.size());
  std::vector<std::string> errors(files.size());
  std::atomic<size_t> nextFile{0};
  auto work = [&] {
    for (size_t i = nextFile++; i < files.size(); i = nextFile++) {
      try {
        decoded[i] = decodeImage(files[i].first, options.maxPixels);
      } catch (const std::exception& e) {
        errors[i] = e.what();
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
    const DecodedImage& img = decoded[static_cast<size_t>(i)];
    ds.labels.data_ptr<int64_t>()[i] = files[static_cast<size_t>(i)].second;
    at::Tensor chw = at::from_blob(const_cast<uint8_t*>(img.rgb.data()), {img.height, img.width, 3}, at::kByte)
                         .permute({2, 0, 1});
    if (options.resize > 0) {
      // torchvision's Resize on tensors: bilinear, antialias, align_corners=False, rounded back to uint8.
      const at::Tensor f = chw.unsqueeze(0).to(at::kFloat);
      chw = at::_upsample_bilinear2d_aa(f, {h, w}, /*align_corners=*/false).squeeze(0).round().clamp(0, 255).to(at::kByte);
    } else if (img.height != h || img.width != w) {
      DDP_THROW(DataError, "data: image '", files[static_cast<size_t>(i)].first, "' is ", img.width, "x", img.height,
                " but '", files.front().first, "' is ", w, "x", h, "; set data.image_size to resize them all");
    }
    ds.images[i].copy_(chw);
  }
  ds.mean = options.mean;
  ds.stddev = options.stddev;
  return ds;
}

}  // namespace ddp::worker::data
