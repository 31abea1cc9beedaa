#include "worker/data/augment.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace ddp::worker::data {
namespace {

// splitmix64: a counter-based generator, so each (seed, epoch, sample, draw) stands alone.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Draws {
  uint64_t state;
  Draws(uint64_t seed, int64_t epoch, int64_t sample)
      : state(mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(sample))) {}
  uint64_t next() { return state = mix(state); }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

}  // namespace

void rotateImage(const uint8_t* in, uint8_t* out, int64_t h, int64_t w, double degrees) {
  const double a = degrees * M_PI / 180.0;
  const double c = std::cos(a), s = std::sin(a);
  const double cy = (static_cast<double>(h) - 1) / 2, cx = (static_cast<double>(w) - 1) / 2;
  auto at = [&](int64_t y, int64_t x) -> double { return y < 0 || y >= h || x < 0 || x >= w ? 0.0 : in[y * w + x]; };
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      // The source point that lands on (y, x): the inverse of a counter-clockwise rotation (as
      // torchvision's positive angles) about the centre, in image coordinates (y down).
      const double dx = static_cast<double>(x) - cx, dy = static_cast<double>(y) - cy;
      const double sx = c * dx - s * dy + cx, sy = s * dx + c * dy + cy;
      const double fx = std::floor(sx), fy = std::floor(sy);
      const auto x0 = static_cast<int64_t>(fx), y0 = static_cast<int64_t>(fy);
      const double tx = sx - fx, ty = sy - fy;
      const double v = (1 - ty) * ((1 - tx) * at(y0, x0) + tx * at(y0, x0 + 1)) +
                       ty * ((1 - tx) * at(y0 + 1, x0) + tx * at(y0 + 1, x0 + 1));
      out[y * w + x] = static_cast<uint8_t>(std::lround(std::min(255.0, std::max(0.0, v))));
    }
  }
}

void augmentImage(const uint8_t* in, uint8_t* out, int64_t channels, int64_t height, int64_t width,
                  const AugmentOptions& options, uint64_t seed, int64_t epoch, int64_t sample) {
  Draws draws(seed, epoch, sample);
  const int64_t plane = height * width;
  std::vector<uint8_t> work(in, in + channels * plane);
  std::vector<uint8_t> tmp(static_cast<size_t>(plane));
  if (options.rotateDegrees > 0) {
    const double angle = (2 * draws.uniform() - 1) * options.rotateDegrees;  // one angle for all channels
    for (int64_t ch = 0; ch < channels; ++ch) {
      rotateImage(work.data() + ch * plane, tmp.data(), height, width, angle);
      std::memcpy(work.data() + ch * plane, tmp.data(), static_cast<size_t>(plane));
    }
  }
  int64_t top = 0, left = 0;
  if (options.cropPadding > 0) {
    const int64_t p = options.cropPadding;
    top = draws.below(2 * p + 1) - p;  // offset of the crop in the padded image, minus the padding
    left = draws.below(2 * p + 1) - p;
  }
  const bool flip = options.horizontalFlip && (draws.next() & 1) != 0;
  for (int64_t ch = 0; ch < channels; ++ch) {
    const uint8_t* src = work.data() + ch * plane;
    uint8_t* dst = out + ch * plane;
    for (int64_t y = 0; y < height; ++y) {
      for (int64_t x = 0; x < width; ++x) {
        const int64_t sy = y + top;
        const int64_t sxCropped = x + left;
        const int64_t sx = flip ? (width - 1 - x) + left : sxCropped;
        dst[y * width + x] = sy < 0 || sy >= height || sx < 0 || sx >= width ? 0 : src[sy * width + sx];
      }
    }
  }
}

}  // namespace ddp::worker::data
