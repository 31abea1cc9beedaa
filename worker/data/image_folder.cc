#include "worker/data/image_folder.h"

#include <ATen/ops/_upsample_bilinear2d_aa.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <atomic>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
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

DecodedImage decodePng(const std::string& path) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    DDP_THROW(DataError, "data: cannot decode PNG '", path, "' (", image.message, ")");
  }
  image.format = PNG_FORMAT_RGB;  // gray, palette and alpha become RGB as Pillow's convert("RGB")
  DecodedImage out;
  out.height = image.height;
  out.width = image.width;
  out.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr)) {
    const std::string why = image.message;
    png_image_free(&image);
    DDP_THROW(DataError, "data: cannot decode PNG '", path, "' (", why, ")");
  }
  return out;
}

struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void onJpegError(j_common_ptr info) {
  auto* error = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, error->message);
  std::longjmp(error->jump, 1);
}

DecodedImage decodeJpeg(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) DDP_THROW(DataError, "data: cannot read image '", path, "' (", std::strerror(errno), ")");
  jpeg_decompress_struct info;
  JpegError error;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = onJpegError;
  DecodedImage out;
  if (setjmp(error.jump) != 0) {
    jpeg_destroy_decompress(&info);
    DDP_THROW(DataError, "data: cannot decode JPEG '", path, "' (", error.message, ")");
  }
  jpeg_create_decompress(&info);
  jpeg_stdio_src(&info, file.get());
  jpeg_read_header(&info, TRUE);
  info.out_color_space = JCS_RGB;  // Pillow's defaults otherwise: islow DCT, fancy upsampling
  jpeg_start_decompress(&info);
  out.height = info.output_height;
  out.width = info.output_width;
  out.rgb.resize(static_cast<size_t>(out.height * out.width * 3));
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = out.rgb.data() + static_cast<size_t>(info.output_scanline) * static_cast<size_t>(out.width) * 3;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return out;
}

}  // namespace

DecodedImage decodeImage(const std::string& path) {
  unsigned char magic[4] = {};
  {
    std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!file) DDP_THROW(DataError, "data: cannot read image '", path, "' (", std::strerror(errno), ")");
    if (std::fread(magic, 1, sizeof magic, file.get()) != sizeof magic) {
      DDP_THROW(DataError, "data: image '", path, "' is too short to be a PNG or JPEG");
    }
  }
  if (magic[0] == 0x89 && magic[1] == 'P' && magic[2] == 'N' && magic[3] == 'G') return decodePng(path);
  if (magic[0] == 0xFF && magic[1] == 0xD8) return decodeJpeg(path);
  DDP_THROW(DataError, "data: image '", path, "' is neither PNG nor JPEG");
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
        decoded[i] = decodeImage(files[i].first);
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
