// torchvision's ImageNet transforms on PIL images, computed as Pillow and torchvision compute them:
// Pillow's resampling (libImaging/Resample.c: 8-bit fixed-point coefficients, horizontal pass then
// vertical), RandomResizedCrop.get_params, Resize's and CenterCrop's rounding.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "ddp/image_data.h"

namespace ddp {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS for 8-bit images

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Python's round() to an int: halves to even (the default rounding mode).
int64_t pythonRound(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for the output positions [first, first + count)
// of an output of `outSize`, bilinear filter (support 1).
struct Coefficients {
  int ksize = 0;
  std::vector<int> bounds;  // (xmin, n) per output position
  std::vector<int32_t> k;   // ksize per output position
};

Coefficients precomputeCoefficients(int inSize, float in0, float in1, int outSize, int first, int count) {
  Coefficients c;
  const double scale = static_cast<double>(in1 - in0) / outSize;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(count) * 2);
  c.k.assign(static_cast<size_t>(count) * c.ksize, 0);
  std::vector<double> w(static_cast<size_t>(c.ksize));
  for (int o = 0; o < count; ++o) {
    const int xx = first + o;
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > inSize) xmax = inSize;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      double t = (x + xmin - center + 0.5) * ss;
      if (t < 0.0) t = -t;
      w[static_cast<size_t>(x)] = t < 1.0 ? 1.0 - t : 0.0;
      ww += w[static_cast<size_t>(x)];
    }
    int32_t* k = &c.k[static_cast<size_t>(o) * c.ksize];
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[static_cast<size_t>(x)] / ww : w[static_cast<size_t>(x)];
      k[x] = v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << kPrecisionBits))
                   : static_cast<int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[static_cast<size_t>(o) * 2] = xmin;
    c.bounds[static_cast<size_t>(o) * 2 + 1] = xmax;
  }
  return c;
}

inline uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

// One row of Pillow's horizontal pass (ImagingResampleHorizontal_8bpc, 3 bands): output pixel xx
// sums its taps' bytes times the fixed-point coefficients, plus a half, then clip8.
void horizontalRowScalar(const uint8_t* row, const Coefficients& c, int first, int last, uint8_t* out) {
  for (int xx = first; xx < last; ++xx) {
    const int xmin = c.bounds[static_cast<size_t>(xx) * 2];
    const int n = c.bounds[static_cast<size_t>(xx) * 2 + 1];
    const int32_t* k = &c.k[static_cast<size_t>(xx) * c.ksize];
    int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
    const uint8_t* p = row + static_cast<int64_t>(xmin) * 3;
    for (int x = 0; x < n; ++x) {
      s0 += p[x * 3 + 0] * k[x];
      s1 += p[x * 3 + 1] * k[x];
      s2 += p[x * 3 + 2] * k[x];
    }
    out[xx * 3 + 0] = clip8(s0);
    out[xx * 3 + 1] = clip8(s1);
    out[xx * 3 + 2] = clip8(s2);
  }
}

#if defined(__x86_64__)
// The same sums, R, G and B of a tap in three lanes of one SSE4.1 multiply (integer arithmetic:
// bitwise Pillow's). A tap reads 4 bytes, so pixels whose taps reach the row's last pixel take
// the scalar loop (no read past the image).
__attribute__((target("sse4.1"))) void horizontalRowSse41(const uint8_t* row, int inW, const Coefficients& c, int ow,
                                                          uint8_t* out) {
  int safe = ow;  // output pixels [0, safe) never read the last input pixel
  while (safe > 0 && c.bounds[static_cast<size_t>(safe - 1) * 2] + c.bounds[static_cast<size_t>(safe - 1) * 2 + 1] >= inW) {
    --safe;
  }
  const __m128i half = _mm_set1_epi32(1 << (kPrecisionBits - 1));
  for (int xx = 0; xx < safe; ++xx) {
    const int xmin = c.bounds[static_cast<size_t>(xx) * 2];
    const int n = c.bounds[static_cast<size_t>(xx) * 2 + 1];
    const int32_t* k = &c.k[static_cast<size_t>(xx) * c.ksize];
    const uint8_t* p = row + static_cast<int64_t>(xmin) * 3;
    __m128i acc = half;
    for (int x = 0; x < n; ++x) {
      int32_t bytes;
      std::memcpy(&bytes, p + x * 3, 4);
      const __m128i v = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(bytes));
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(v, _mm_set1_epi32(k[x])));
    }
    // clip8: >> PRECISION_BITS, then clamp to [0, 255] (the saturating packs).
    const __m128i shifted = _mm_srai_epi32(acc, kPrecisionBits);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(shifted, shifted), _mm_setzero_si128());
    const int32_t rgb = _mm_cvtsi128_si32(packed);
    std::memcpy(out + xx * 3, &rgb, 3);
  }
  horizontalRowScalar(row, c, safe, ow, out);
}
#endif

void horizontalRow(const uint8_t* row, int inW, const Coefficients& c, int ow, uint8_t* out) {
#if defined(__x86_64__)
  static const bool sse41 = __builtin_cpu_supports("sse4.1");
  if (sse41) return horizontalRowSse41(row, inW, c, ow, out);
#endif
  (void)inW;
  horizontalRowScalar(row, c, 0, ow, out);
}

// Pillow's ImagingResampleInner (8 bits, 3 bands) on a view of inW x inH pixels (`stride` bytes a
// row) from `box` = (x0, y0, x1, y1) to outW x outH, producing only the output window
// [ox, ox + ow) x [oy, oy + oh) (each output pixel depends on its own coefficients only, so a
// window is bitwise the same as cropping the whole result).
RgbImage resample(const uint8_t* in, int64_t stride, int inW, int inH, const float box[4], int outW, int outH, int ox,
                  int oy, int ow, int oh) {
  const bool needHorizontal = outW != inW || box[0] != 0.0f || box[2] != static_cast<float>(outW);
  const bool needVertical = outH != inH || box[1] != 0.0f || box[3] != static_cast<float>(outH);
  const Coefficients vert = precomputeCoefficients(inH, box[1], box[3], outH, oy, oh);
  const int yFirst = vert.bounds[0];
  const int yLast = vert.bounds[static_cast<size_t>(oh - 1) * 2] + vert.bounds[static_cast<size_t>(oh - 1) * 2 + 1];

  // The horizontal pass over the rows the vertical pass reads: temp is (yLast - yFirst) x ow.
  std::vector<uint8_t> temp;
  const uint8_t* src = in;
  int64_t srcStride = stride;
  int srcRow0 = 0;  // the source row that src's row 0 is
  int srcCol0 = ox;  // without a horizontal pass the window's columns are read from the input
  if (needHorizontal) {
    const Coefficients hor = precomputeCoefficients(inW, box[0], box[2], outW, ox, ow);
    const int rows = yLast - yFirst;
    temp.resize(static_cast<size_t>(rows) * ow * 3);
    for (int y = 0; y < rows; ++y) {
      horizontalRow(in + static_cast<int64_t>(y + yFirst) * stride, inW, hor, ow, &temp[static_cast<size_t>(y) * ow * 3]);
    }
    src = temp.data();
    srcStride = static_cast<int64_t>(ow) * 3;
    srcRow0 = yFirst;
    srcCol0 = 0;
  }

  RgbImage out;
  out.height = oh;
  out.width = ow;
  out.pixels.resize(static_cast<size_t>(oh) * ow * 3);
  if (!needVertical) {
    for (int yy = 0; yy < oh; ++yy) {
      std::memcpy(&out.pixels[static_cast<size_t>(yy) * ow * 3],
                  src + static_cast<int64_t>(oy + yy - srcRow0) * srcStride + static_cast<int64_t>(srcCol0) * 3,
                  static_cast<size_t>(ow) * 3);
    }
    return out;
  }
  std::vector<int32_t> acc(static_cast<size_t>(ow) * 3);
  for (int yy = 0; yy < oh; ++yy) {
    const int ymin = vert.bounds[static_cast<size_t>(yy) * 2];
    const int n = vert.bounds[static_cast<size_t>(yy) * 2 + 1];
    const int32_t* k = &vert.k[static_cast<size_t>(yy) * vert.ksize];
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    for (int y = 0; y < n; ++y) {
      const uint8_t* row = src + static_cast<int64_t>(y + ymin - srcRow0) * srcStride + static_cast<int64_t>(srcCol0) * 3;
      const int32_t ky = k[y];
      for (int i = 0; i < ow * 3; ++i) acc[static_cast<size_t>(i)] += row[i] * ky;
    }
    uint8_t* o = &out.pixels[static_cast<size_t>(yy) * ow * 3];
    for (int i = 0; i < ow * 3; ++i) o[i] = clip8(acc[static_cast<size_t>(i)]);
  }
  return out;
}

void flipHorizontally(RgbImage& image) {
  for (int64_t y = 0; y < image.height; ++y) {
    uint8_t* row = &image.pixels[static_cast<size_t>(y * image.width * 3)];
    for (int64_t a = 0, b = image.width - 1; a < b; ++a, --b) {
      for (int c = 0; c < 3; ++c) std::swap(row[a * 3 + c], row[b * 3 + c]);
    }
  }
}

// torch.empty(1).uniform_(from, to) given its draw x: from and to become float32, x * (to - from) +
// from is computed in double (the CPU kernel's accumulate type) and stored as float32.
float torchUniform(double x, double from, double to) {
  const float f = static_cast<float>(from);
  const float t = static_cast<float>(to);
  return static_cast<float>(x * static_cast<double>(t - f) + static_cast<double>(f));
}

// Python's int(round((size - crop) / 2.0)): CenterCrop's offset.
int64_t centerOffset(int64_t size, int64_t crop) { return pythonRound(static_cast<double>(size - crop) / 2.0); }

// transformImage's plan for one sample: the region of the full-size image the output comes from.
struct Plan {
  int64_t outW = 0, outH = 0;       // the resize's full output (Pillow's resize target)
  int64_t winX = 0, winY = 0;       // the window of it kept (CenterCrop), size x size
  CropBox region;                   // the full-size region resized into outW x outH
  bool flip = false;
};

}  // namespace

SampleRandom::SampleRandom(uint64_t seed, int64_t epoch, int64_t index)
    : key_(splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index))) {}

double SampleRandom::uniform() {
  // splitmix64's own stream from key_: counter-based, so draw k of a sample needs nothing else.
  const uint64_t bits = splitmix64(key_ + static_cast<uint64_t>(counter_) * 0x9E3779B97F4A7C15ULL);
  ++counter_;
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int64_t SampleRandom::randint(int64_t low, int64_t high) {
  DDP_ENFORCE(high > low, "randint(", low, ", ", high, ")");
  const auto span = static_cast<double>(high - low);
  return low + std::min(high - low - 1, static_cast<int64_t>(std::floor(uniform() * span)));
}

CropBox randomResizedCropParams(int64_t height, int64_t width, SampleRandom& random,
                                const RandomResizedCropOptions& options) {
  // torchvision.transforms.RandomResizedCrop.get_params, line by line.
  const double area = static_cast<double>(height) * static_cast<double>(width);
  // torch.log(torch.tensor(ratio)): float32 logs (computed in double and rounded: within an ulp).
  const float logMin = static_cast<float>(std::log(static_cast<double>(static_cast<float>(options.ratioMin))));
  const float logMax = static_cast<float>(std::log(static_cast<double>(static_cast<float>(options.ratioMax))));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double targetArea = area * static_cast<double>(torchUniform(random.uniform(), options.scaleMin, options.scaleMax));
    const float logRatio = torchUniform(random.uniform(), logMin, logMax);
    const double aspect = static_cast<double>(static_cast<float>(std::exp(static_cast<double>(logRatio))));
    const int64_t w = pythonRound(std::sqrt(targetArea * aspect));
    const int64_t h = pythonRound(std::sqrt(targetArea / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t i = random.randint(0, height - h + 1);
      const int64_t j = random.randint(0, width - w + 1);
      return {i, j, h, w};
    }
  }
  // Fallback to central crop.
  const double inRatio = static_cast<double>(width) / static_cast<double>(height);
  const double lo = std::min(options.ratioMin, options.ratioMax);
  const double hi = std::max(options.ratioMin, options.ratioMax);
  int64_t w = width, h = height;
  if (inRatio < lo) {
    h = pythonRound(static_cast<double>(w) / lo);
  } else if (inRatio > hi) {
    w = pythonRound(static_cast<double>(h) * hi);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

RgbImage resizeBilinear(const RgbImage& image, const CropBox& crop, int64_t height, int64_t width) {
  DDP_ENFORCE(crop.top >= 0 && crop.left >= 0 && crop.height > 0 && crop.width > 0 &&
                  crop.top + crop.height <= image.height && crop.left + crop.width <= image.width,
              "crop (", crop.top, ", ", crop.left, ", ", crop.height, ", ", crop.width, ") outside ", image.height, "x",
              image.width);
  DDP_ENFORCE(height > 0 && width > 0);
  const int64_t stride = image.width * 3;
  const uint8_t* origin = image.pixels.data() + crop.top * stride + crop.left * 3;
  const float box[4] = {0.0f, 0.0f, static_cast<float>(crop.width), static_cast<float>(crop.height)};
  if (crop.height == height && crop.width == width) {  // Image.resize returns a copy at the same size
    RgbImage out;
    out.height = height;
    out.width = width;
    out.pixels.resize(static_cast<size_t>(height * width * 3));
    for (int64_t y = 0; y < height; ++y) {
      std::memcpy(&out.pixels[static_cast<size_t>(y * width * 3)], origin + y * stride, static_cast<size_t>(width * 3));
    }
    return out;
  }
  return resample(origin, stride, static_cast<int>(crop.width), static_cast<int>(crop.height), box,
                  static_cast<int>(width), static_cast<int>(height), 0, 0, static_cast<int>(width),
                  static_cast<int>(height));
}

RgbImage transformImage(const uint8_t* data, size_t size, const std::string& name, const ImageTransformOptions& options,
                        uint64_t seed, int64_t epoch, int64_t index) {
  const int64_t s = options.size;
  if (s < 1) DDP_THROW(ConfigError, "image transform: size ", s, " must be >= 1");
  const ImageHeader header = readImageHeader(data, size, name);
  const int64_t H = header.height, W = header.width;
  Plan plan;
  switch (options.kind) {
    case ImageTransformKind::kTrain: {
      SampleRandom random(seed, epoch, index);
      plan.region = randomResizedCropParams(H, W, random, options.crop);
      plan.outH = plan.outW = s;
      plan.flip = options.flipProbability > 0 && static_cast<float>(random.uniform()) < options.flipProbability;
      break;
    }
    case ImageTransformKind::kEval: {
      const int64_t r = options.resizeSize > 0 ? options.resizeSize : s * 8 / 7;
      if (r < s) DDP_THROW(ConfigError, "image transform: resize size ", r, " is smaller than the crop ", s);
      // torchvision's _compute_resized_output_size: the shorter side to r, the longer int(r * long / short).
      const int64_t shortSide = std::min(H, W), longSide = std::max(H, W);
      const auto newLong = static_cast<int64_t>(static_cast<double>(r) * static_cast<double>(longSide) /
                                                static_cast<double>(shortSide));
      plan.outW = W <= H ? r : newLong;
      plan.outH = W <= H ? newLong : r;
      plan.region = {0, 0, H, W};
      plan.winY = centerOffset(plan.outH, s);
      plan.winX = centerOffset(plan.outW, s);
      break;
    }
    case ImageTransformKind::kResize:
      plan.outH = plan.outW = s;
      plan.region = {0, 0, H, W};
      break;
  }

  // DCT scaling: only when the region is at least twice the resize target on both sides.
  const bool scaled = options.dctScaling && header.jpeg && plan.region.height >= 2 * plan.outH &&
                      plan.region.width >= 2 * plan.outW;
  ImageDecodeOptions decodeOptions;
  decodeOptions.maxPixels = options.maxPixels;
  if (scaled) {
    decodeOptions.minHeight = (H * plan.outH + plan.region.height - 1) / plan.region.height;
    decodeOptions.minWidth = (W * plan.outW + plan.region.width - 1) / plan.region.width;
  }
  const RgbImage image = decodeImage(data, size, name, decodeOptions);
  RgbImage out;
  if (image.height == H && image.width == W) {
    // Exactly torchvision on PIL: crop, then resize the crop (its edges clamp the filter).
    const CropBox& c = plan.region;
    const uint8_t* origin = image.pixels.data() + (c.top * W + c.left) * 3;
    if (c.height == plan.outH && c.width == plan.outW) {
      out = resizeBilinear(image, {c.top + plan.winY, c.left + plan.winX, s, s}, s, s);
    } else {
      const float box[4] = {0.0f, 0.0f, static_cast<float>(c.width), static_cast<float>(c.height)};
      out = resample(origin, W * 3, static_cast<int>(c.width), static_cast<int>(c.height), box,
                     static_cast<int>(plan.outW), static_cast<int>(plan.outH), static_cast<int>(plan.winX),
                     static_cast<int>(plan.winY), static_cast<int>(s), static_cast<int>(s));
    }
  } else {
    // A DCT-scaled decode: the region in the smaller image's coordinates, as Pillow's resize(box=...).
    const double fy = static_cast<double>(image.height) / static_cast<double>(H);
    const double fx = static_cast<double>(image.width) / static_cast<double>(W);
    const CropBox& c = plan.region;
    const float box[4] = {static_cast<float>(c.left * fx), static_cast<float>(c.top * fy),
                          static_cast<float>((c.left + c.width) * fx), static_cast<float>((c.top + c.height) * fy)};
    out = resample(image.pixels.data(), image.width * 3, static_cast<int>(image.width), static_cast<int>(image.height),
                   box, static_cast<int>(plan.outW), static_cast<int>(plan.outH), static_cast<int>(plan.winX),
                   static_cast<int>(plan.winY), static_cast<int>(s), static_cast<int>(s));
  }
  if (plan.flip) flipHorizontally(out);
  return out;
}

void normalizeImage(const RgbImage& image, float* out, const std::vector<float>& mean, const std::vector<float>& stddev) {
  if (mean.size() != 3 || stddev.size() != 3) {
    DDP_THROW(ConfigError, "ddp::normalizeImage: mean and stddev need 3 values (R, G, B), got ", mean.size(), " and ",
              stddev.size());
  }
  // Per byte value, in float32 as ToTensor then Normalize compute it: (x / 255 - mean) / std.
  float lut[3][256];
  for (size_t c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) lut[c][v] = (static_cast<float>(v) / 255.0f - mean[c]) / stddev[c];
  }
  const int64_t plane = image.height * image.width;
  const uint8_t* px = image.pixels.data();
  for (int c = 0; c < 3; ++c) {
    for (int64_t p = 0; p < plane; ++p) out[c * plane + p] = lut[c][px[p * 3 + c]];
  }
}

}  // namespace ddp
