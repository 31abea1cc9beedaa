#include "worker/data/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>

#include "common/error.h"

namespace ddp::worker::data {

TensorDataset makeSynthetic(const SyntheticOptions& options) {
  if (options.size < 0) {
    DDP_THROW(ConfigError, "synthetic data: size must be >= 0, got ", options.size);
  }
  if (options.shape.empty()) {
    DDP_THROW(ConfigError, "synthetic data: sample shape must have at least one dimension");
  }
  int64_t features = 1;
  for (int64_t d : options.shape) {
    if (d < 1) {
      DDP_THROW(ConfigError, "synthetic data: every sample dimension must be >= 1, got ", d);
    }
    features *= d;
  }
  if (options.numClasses < 1) {
    DDP_THROW(ConfigError, "synthetic data: numClasses must be >= 1, got ", options.numClasses);
  }

  std::vector<int64_t> fullShape = {options.size};
  fullShape.insert(fullShape.end(), options.shape.begin(), options.shape.end());
  // Each tensor gets its own generator so the images do not depend on the rule
  // and the rule does not depend on how many images came before it.
  auto imageGen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  auto ruleGen = at::make_generator<at::CPUGeneratorImpl>(options.ruleSeed);

  TensorDataset ds;
  ds.images = at::randn(fullShape, imageGen, at::kFloat);
  const at::Tensor rule = at::randn({features, options.numClasses}, ruleGen, at::kFloat);
  ds.labels = at::argmax(at::matmul(ds.images.reshape({options.size, features}), rule), 1);
  return ds;
}

}  // namespace ddp::worker::data
