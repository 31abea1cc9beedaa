#include "worker/evaluate.h"

#include "worker/data/gather_batch.h"

#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>

namespace ddp::worker {

EvalCounts evaluate(torch::nn::AnyModule& model, const data::TensorDataset& test, c10::Device device,
                    int64_t batchSize, comm::Communicator& comm) {
  c10::NoGradGuard noGrad;
  model.ptr()->eval();
  const int64_t n = test.size();
  const int64_t begin = n * comm.rank() / comm.size();
  const int64_t end = n * (comm.rank() + 1) / comm.size();
  int64_t correct = 0;
  for (int64_t i = begin; i < end; i += batchSize) {
    const int64_t len = std::min(batchSize, end - i);
    const data::Batch b = data::sliceBatch(test, i, len);
    const at::Tensor x = b.images.to(device);
    const at::Tensor y = b.labels.to(device);
    correct += model.forward(x).argmax(1).eq(y).sum().item<int64_t>();
  }
  at::Tensor counts = at::tensor({correct, end - begin}, at::kLong).to(device);
  comm.allReduceSum(counts);
  counts = counts.cpu();
  return EvalCounts{counts[0].item<int64_t>(), counts[1].item<int64_t>()};
}

}  // namespace ddp::worker
