// JPEG through TurboJPEG, PNG through libpng's progressive reader, both to the bytes Pillow's
// convert("RGB") gives.
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "common/error.h"
#include "ddp/image_data.h"

namespace ddp {
namespace {

bool isJpeg(const uint8_t* d, size_t n) { return n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF; }
bool isPng(const uint8_t* d, size_t n) { return n >= 8 && png_sig_cmp(d, 0, 8) == 0; }

// One TurboJPEG handle per thread: a handle is not thread-safe, and making one costs an allocation.
std::unique_ptr<void, int (*)(tjhandle)>& jpegHandleSlot() {
  thread_local std::unique_ptr<void, int (*)(tjhandle)> handle(nullptr, &tjDestroy);
  return handle;
}

tjhandle jpegHandle() {
  auto& handle = jpegHandleSlot();
  if (!handle) handle.reset(tjInitDecompress());
  if (!handle) DDP_THROW(DataError, "data: cannot start a TurboJPEG decoder (", tjGetErrorStr2(nullptr), ")");
  return handle.get();
}

// A fatal error can leave the handle failed: every later JPEG of the thread then failed with the same
// error (a header cut inside its Huffman tables: "Bogus Huffman table definition"). The next image
// gets a new handle.
[[noreturn]] void jpegFailed(const std::string& name) {
  const std::string why = tjGetErrorStr2(jpegHandle());
  jpegHandleSlot().reset();
  DDP_THROW(DataError, "data: cannot decode JPEG '", name, "' (", why, ")");
}

ImageHeader jpegHeader(const uint8_t* data, size_t size, const std::string& name, int* colorspace) {
  int width = 0, height = 0, subsampling = 0;
  if (tjDecompressHeader3(jpegHandle(), data, static_cast<unsigned long>(size), &width, &height, &subsampling,
                          colorspace) != 0) {
    jpegFailed(name);
  }
  return {true, height, width};
}

// Before a pixel buffer is sized from a header: Pillow's Image._decompression_bomb_check.
void checkPixels(const ImageHeader& header, const std::string& name, int64_t maxPixels) {
  const int64_t pixels = std::max<int64_t>(1, header.width) * std::max<int64_t>(1, header.height);
  if (maxPixels > 0 && pixels > maxPixels) {
    DDP_THROW(DataError, "data: image '", name, "' says it is ", header.width, " x ", header.height, " (", pixels,
              " pixels), over the limit of ", maxPixels, " (Pillow's decompression-bomb limit): a corrupt header or "
              "a decompression bomb; if the image is real, raise data.max_image_pixels (ImageDecodeOptions::maxPixels), 0 "
              "for no limit");
  }
}

// Pillow opens Adobe CMYK JPEGs as "CMYK;I" (inverted back) and converts with MULDIV255(255 - c, 255 - k):
// on the raw (inverted) bytes libjpeg returns, that is MULDIV255(c, k).
uint8_t mulDiv255(unsigned a, unsigned b) {
  const unsigned t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

RgbImage decodeJpeg(const uint8_t* data, size_t size, const std::string& name, const ImageDecodeOptions& options) {
  int colorspace = 0;
  const ImageHeader header = jpegHeader(data, size, name, &colorspace);
  checkPixels(header, name, options.maxPixels);
  int num = 1, denom = 1;
  if (options.minHeight > 0 && options.minWidth > 0) {
    for (int d : {8, 4, 2}) {  // smallest first
      if (TJSCALED(header.height, (tjscalingfactor{1, d})) >= options.minHeight &&
          TJSCALED(header.width, (tjscalingfactor{1, d})) >= options.minWidth) {
        denom = d;
        break;
      }
    }
  }
  const tjscalingfactor factor{num, denom};
  RgbImage out;
  out.height = TJSCALED(header.height, factor);
  out.width = TJSCALED(header.width, factor);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  std::vector<uint8_t> cmykPixels;
  uint8_t* target = nullptr;
  if (cmyk) {
    cmykPixels.resize(static_cast<size_t>(out.height * out.width * 4));
    target = cmykPixels.data();
  } else {
    out.pixels.resize(static_cast<size_t>(out.height * out.width * 3));
    target = out.pixels.data();
  }
  // Accurate (islow) DCT and fancy upsampling: Pillow's defaults.
  const int rc = tjDecompress2(jpegHandle(), data, static_cast<unsigned long>(size), target, static_cast<int>(out.width),
                               0, static_cast<int>(out.height), cmyk ? TJPF_CMYK : TJPF_RGB, TJFLAG_ACCURATEDCT);
  if (rc != 0) {
    const std::string why = tjGetErrorStr2(jpegHandle());
    // Warnings (extraneous bytes, ...) leave a whole image, as Pillow accepts it; a premature end
    // does not: Pillow raises "image file is truncated".
    if (tjGetErrorCode(jpegHandle()) != TJERR_WARNING || why.find("Premature end") != std::string::npos) {
      jpegFailed(name);
    }
  }
  if (cmyk) {
    out.pixels.resize(static_cast<size_t>(out.height * out.width * 3));
    for (size_t p = 0, n = static_cast<size_t>(out.height * out.width); p < n; ++p) {
      const uint8_t* c = &cmykPixels[p * 4];
      for (int ch = 0; ch < 3; ++ch) out.pixels[p * 3 + ch] = mulDiv255(c[ch], c[3]);
    }
  }
  return out;
}

struct PngReader {
  const uint8_t* data;
  size_t size;
  size_t offset;
  std::jmp_buf jump;
  char message[256];
};

void onPngError(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(reader->message, sizeof reader->message, "%s", message);
  std::longjmp(reader->jump, 1);
}
void onPngWarning(png_structp, png_const_charp) {}  // Pillow ignores them too (bad CRCs of ancillary chunks, ...)

void readPngBytes(png_structp png, png_bytep out, png_size_t count) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (reader->size - reader->offset < count) png_error(png, "image file is truncated");
  std::memcpy(out, reader->data + reader->offset, count);
  reader->offset += count;
}

// Only plain locals here: setjmp/longjmp skip destructors. Returns false with reader->message set.
bool decodePngInto(PngReader* reader, png_structp png, png_infop info, RgbImage* out, std::vector<png_bytep>* rows,
                   std::vector<uint8_t>* scratch) {
  if (setjmp(reader->jump) != 0) return false;
  png_set_read_fn(png, reader, readPngBytes);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int colorType = png_get_color_type(png, info);
  const int bitDepth = png_get_bit_depth(png, info);
  // Pillow opens 16-bit gray as "I;16", whose convert("RGB") clips values to 255.
  const bool gray16 = colorType == PNG_COLOR_TYPE_GRAY && bitDepth == 16;
  // convert("RGB"): palette → RGB, gray → RGB (1/2/4 bits scaled to 0..255), alpha dropped,
  // other 16-bit samples → the high byte (Pillow's RGB;16B / LA;16B unpackers).
  if (gray16) {
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != static_cast<size_t>(width) * 2) png_error(png, "unexpected row layout");
    out->height = height;
    out->width = width;
    out->pixels.resize(static_cast<size_t>(width) * height * 3);
    std::vector<uint8_t>& wide = *scratch;
    wide.resize(static_cast<size_t>(width) * height * 2);
    rows->resize(height);
    for (png_uint_32 y = 0; y < height; ++y) (*rows)[y] = wide.data() + static_cast<size_t>(y) * width * 2;
    png_read_image(png, rows->data());
    png_read_end(png, nullptr);
    for (size_t p = 0, n = static_cast<size_t>(width) * height; p < n; ++p) {
      const unsigned v = (unsigned{wide[p * 2]} << 8) | wide[p * 2 + 1];
      const auto byte = static_cast<uint8_t>(v > 255 ? 255 : v);
      out->pixels[p * 3] = out->pixels[p * 3 + 1] = out->pixels[p * 3 + 2] = byte;
    }
    return true;
  }
  if (bitDepth == 16) png_set_strip_16(png);
  if (colorType == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (colorType == PNG_COLOR_TYPE_GRAY && bitDepth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (colorType == PNG_COLOR_TYPE_GRAY || colorType == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(width) * 3) png_error(png, "unexpected row layout");
  out->height = height;
  out->width = width;
  out->pixels.resize(static_cast<size_t>(width) * height * 3);
  rows->resize(height);
  for (png_uint_32 y = 0; y < height; ++y) (*rows)[y] = out->pixels.data() + static_cast<size_t>(y) * width * 3;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  return true;
}

RgbImage decodePng(const uint8_t* data, size_t size, const std::string& name) {
  auto reader = std::make_unique<PngReader>();
  *reader = PngReader{data, size, 0, {}, {}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, reader.get(), onPngError, onPngWarning);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    DDP_THROW(DataError, "data: cannot decode PNG '", name, "' (out of memory)");
  }
  RgbImage out;
  std::vector<png_bytep> rows;
  std::vector<uint8_t> scratch;
  const bool ok = decodePngInto(reader.get(), png, info, &out, &rows, &scratch);
  png_destroy_read_struct(&png, &info, nullptr);
  if (!ok) DDP_THROW(DataError, "data: cannot decode PNG '", name, "' (", reader->message, ")");
  return out;
}

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

ImageHeader readImageHeader(const uint8_t* data, size_t size, const std::string& name) {
  if (isJpeg(data, size)) {
    int colorspace = 0;
    return jpegHeader(data, size, name, &colorspace);
  }
  if (isPng(data, size)) {
    // The IHDR chunk comes first: length, "IHDR", width, height.
    if (size < 24 || std::memcmp(data + 12, "IHDR", 4) != 0) {
      DDP_THROW(DataError, "data: cannot decode PNG '", name, "' (no IHDR chunk)");
    }
    return {false, bigEndian32(data + 20), bigEndian32(data + 16)};
  }
  DDP_THROW(DataError, "data: '", name, "' is neither a JPEG nor a PNG (", size, " bytes)");
}

RgbImage decodeImage(const uint8_t* data, size_t size, const std::string& name, const ImageDecodeOptions& options) {
  if (isJpeg(data, size)) return decodeJpeg(data, size, name, options);
  if (isPng(data, size)) {
    checkPixels(readImageHeader(data, size, name), name, options.maxPixels);
    return decodePng(data, size, name);
  }
  DDP_THROW(DataError, "data: '", name, "' is neither a JPEG nor a PNG (", size, " bytes)");
}

RgbImage decodeImageFile(const std::string& path, const ImageDecodeOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DDP_THROW(DataError, "data: cannot read image '", path, "' (", std::strerror(errno), ")");
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return decodeImage(bytes.data(), bytes.size(), path, options);
}

}  // namespace ddp
