// Per-sample random augmentation of uint8 images (torchvision's RandomRotation, RandomCrop with
// padding, RandomHorizontalFlip), reproducible: the draws depend on (seed, epoch, sample) only, so
// a batch is the same whichever loader thread makes it and however many there are.
#pragma once

#include <cstdint>

namespace ddp::worker::data {

struct AugmentOptions {
  double rotateDegrees = 0;  // > 0: rotate by an angle uniform in [-d, d], bilinear, zero fill
  int cropPadding = 0;       // > 0: pad with zeros by this much, then crop the original size at random
  bool horizontalFlip = false;  // mirror with probability 1/2
  bool any() const { return rotateDegrees > 0 || cropPadding > 0 || horizontalFlip; }
};

/// One channel (uint8 [h, w]) rotated counter-clockwise by `degrees` about its centre, bilinear,
/// zero outside, rounded to the nearest byte.
void rotateImage(const uint8_t* in, uint8_t* out, int64_t height, int64_t width, double degrees);

/// Augments one image `in` (uint8 [channels, height, width], contiguous) into `out` (same shape,
/// not overlapping), in torchvision's order: rotation, crop, flip. The same (seed, epoch, sample)
/// gives the same image.
void augmentImage(const uint8_t* in, uint8_t* out, int64_t channels, int64_t height, int64_t width,
                  const AugmentOptions& options, uint64_t seed, int64_t epoch, int64_t sample);

}  // namespace ddp::worker::data
