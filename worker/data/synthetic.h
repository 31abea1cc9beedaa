// Deterministic random data with learnable labels, for benchmarks and tiny tests.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/data/tensor_dataset.h"

namespace ddp::worker::data {

struct SyntheticOptions {
  int64_t size = 1024;                     // number of samples
  std::vector<int64_t> shape = {1, 28, 28};  // per-sample [C, H, W] (any rank >= 1)
  int64_t numClasses = 10;
  uint64_t seed = 0;  // draws the images; give train and test sets different seeds
  // Draws the fixed linear map that labels images. Keep it equal across the
  // train and test sets so both follow one rule a model can learn.
  uint64_t ruleSeed = 0x5eed;
};

/// Images ~ N(0, 1) from a CPU generator seeded with `seed`, float32 [size, shape...];
/// label = argmax(flatten(image) · W) with W ~ N(0, 1) of shape [prod(shape),
/// numClasses] drawn from `ruleSeed`: a linear rule, so even a linear model can fit
/// it, and the classes come out roughly balanced. Same options, same tensors.
/// Throws ddp::ConfigError on a negative size, an empty or non-positive shape, or
/// numClasses < 1.
TensorDataset makeSynthetic(const SyntheticOptions& options);

}  // namespace ddp::worker::data
