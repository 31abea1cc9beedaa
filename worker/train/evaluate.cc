#include "worker/train/evaluate.h"

#include "worker/data/gather_batch.h"

#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>

namespace ddp::worker {

EvalCounts evaluate(torch::nn::AnyModule& model, const data::SampleSource& test, c10::Device device,
                    int64_t batchSize, ProcessGroup& group, data::LoaderOptions loading) {
  c10::NoGradGuard noGrad;
  model.ptr()->eval();
  const int64_t n = test.size();
  const int64_t begin = n * group.rank() / group.size();
  const int64_t end = n * (group.rank() + 1) / group.size();
  loading.device = device;
  loading.augment = {};  // evaluation sees the images as they are
  const auto loader = test.loader(data::contiguousBatches(begin, end, batchSize), loading);
  int64_t correct = 0;
  int64_t seen = 0;  // streamed with data.skip_bad_images: a bad image is left out of its batch
  for (size_t b = 0; b < loader->size(); ++b) {
    const data::Batch batch = loader->next();
    correct += model.forward(batch.images).argmax(1).eq(batch.labels).sum().item<int64_t>();
    seen += batch.labels.size(0);
  }
  at::Tensor counts = at::tensor({correct, seen}, at::kLong).to(device);
  group.allReduce(counts);
  counts = counts.cpu();
  return EvalCounts{counts[0].item<int64_t>(), counts[1].item<int64_t>()};
}

}  // namespace ddp::worker
