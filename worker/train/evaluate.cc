#include "worker/train/evaluate.h"

#include "worker/data/gather_batch.h"

#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>

namespace ddp::worker {

namespace {

// Rank r's contiguous slice of n samples.
int64_t sliceBegin(int64_t n, int rank, int world) { return n * rank / world; }

EvalCounts evaluateWith(const std::function<at::Tensor(const at::Tensor&)>& forward, torch::nn::Module& module,
                        const at::Tensor& filler, const data::SampleSource& test, c10::Device device,
                        int64_t batchSize, ProcessGroup& group, data::LoaderOptions loading) {
  c10::NoGradGuard noGrad;
  module.eval();
  const int64_t n = test.size();
  const int64_t begin = sliceBegin(n, group.rank(), group.size());
  const int64_t end = sliceBegin(n, group.rank() + 1, group.size());
  loading.device = device;
  loading.augment = {};  // evaluation sees the images as they are
  const auto loader = test.loader(data::contiguousBatches(begin, end, batchSize), loading);
  int64_t correct = 0;
  int64_t seen = 0;  // streamed with data.skip_bad_images: a bad image is left out of its batch
  for (size_t b = 0; b < loader->size(); ++b) {
    const data::Batch batch = loader->next();
    correct += forward(batch.images).argmax(1).eq(batch.labels).sum().item<int64_t>();
    seen += batch.labels.size(0);
  }
  if (filler.defined()) {
    // The most batches any rank has (the slices differ by at most one sample).
    int64_t most = 0;
    for (int r = 0; r < group.size(); ++r) {
      const int64_t size = sliceBegin(n, r + 1, group.size()) - sliceBegin(n, r, group.size());
      most = std::max(most, (size + batchSize - 1) / batchSize);
    }
    for (auto b = static_cast<int64_t>(loader->size()); b < most; ++b) (void)forward(filler);
  }
  at::Tensor counts = at::tensor({correct, seen}, at::kLong).to(device);
  group.allReduce(counts);
  counts = counts.cpu();
  return EvalCounts{counts[0].item<int64_t>(), counts[1].item<int64_t>()};
}

}  // namespace

EvalCounts evaluate(torch::nn::AnyModule& model, const data::SampleSource& test, c10::Device device,
                    int64_t batchSize, ProcessGroup& group, data::LoaderOptions loading) {
  return evaluateWith([&](const at::Tensor& x) { return model.forward(x); }, *model.ptr(), at::Tensor(), test, device,
                      batchSize, group, std::move(loading));
}

EvalCounts evaluateCollective(const std::function<at::Tensor(const at::Tensor&)>& forward, torch::nn::Module& module,
                              const at::Tensor& filler, const data::SampleSource& test, c10::Device device,
                              int64_t batchSize, ProcessGroup& group, data::LoaderOptions loading) {
  return evaluateWith(forward, module, filler, test, device, batchSize, group, std::move(loading));
}

}  // namespace ddp::worker
