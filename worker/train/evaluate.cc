#include "worker/train/evaluate.h"

#include "worker/data/gather_batch.h"

#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>

namespace ddp::worker {

EvalCounts evaluate(torch::nn::AnyModule& model, const data::TensorDataset& test, c10::Device device,
                    int64_t batchSize, ProcessGroup& group, data::LoaderOptions loading) {
  c10::NoGradGuard noGrad;
  model.ptr()->eval();
  const int64_t n = test.size();
  const int64_t begin = n * group.rank() / group.size();
  const int64_t end = n * (group.rank() + 1) / group.size();
  loading.device = device;
  loading.augment = {};  // evaluation sees the images as they are
  data::BatchLoader loader(test, data::contiguousBatches(begin, end, batchSize), loading);
  int64_t correct = 0;
  for (size_t b = 0; b < loader.size(); ++b) {
    const data::Batch batch = loader.next();
    correct += model.forward(batch.images).argmax(1).eq(batch.labels).sum().item<int64_t>();
  }
  at::Tensor counts = at::tensor({correct, end - begin}, at::kLong).to(device);
  group.allReduce(counts);
  counts = counts.cpu();
  return EvalCounts{counts[0].item<int64_t>(), counts[1].item<int64_t>()};
}

}  // namespace ddp::worker
