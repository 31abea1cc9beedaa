// The built-in communication hooks: torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py
// (allreduce, fp16, bf16) and powerSGD_hook.py, operation for operation, so that the same
// gradients and seed give PyTorch's result.
#include "ddp/comm_hook.h"

#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linalg_qr.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <unordered_map>

#include "common/error.h"
#include "libddp/torch_compat.h"

namespace ddp {
namespace {

// The gradient as powerSGD_hook's (n, numel / n) matrix, a view into the bucket: tensor.view for a
// contiguous one; for a dense one in another layout whose first dimension is outermost (a
// channels_last convolution weight, whose bucket view keeps the parameter's strides) the same
// shape over its memory order (the columns permuted, which a low-rank approximation does not mind;
// PyTorch's hook cannot view such a tensor at all).
at::Tensor matrixOf(const at::Tensor& tensor, int64_t n) {
  if (tensor.is_contiguous()) return tensor.view({n, -1});
  const int64_t m = n > 0 ? tensor.numel() / n : 0;
  if (tensor.is_non_overlapping_and_dense() && tensor.dim() > 0 && tensor.stride(0) == m) {
    return tensor.as_strided({n, m}, {m, 1});
  }
  DDP_THROW(ConfigError, "ddp::powerSgdHook: a gradient of shape ", tensor.sizes(), " and strides ", tensor.strides(),
            " is neither contiguous nor laid out with its first dimension outermost; make the parameter "
            "contiguous (or channels_last) before wrapping the model");
}


class AllReduceHook final : public CommHook {
 public:
  Work run(GradBucket& bucket, ProcessGroup& group) override {
    // Divide first, then sum (Gloo has no average; dividing first also keeps fp16 from overflowing).
    bucket.buffer().div_(group.size());
    return group.allReduceAsync(bucket.buffer());
  }
  std::string name() const override { return "allreduce"; }
};

class CompressHook final : public CommHook {
 public:
  explicit CompressHook(at::ScalarType dtype) : dtype_(dtype) {}
  Work run(GradBucket& bucket, ProcessGroup& group) override {
    // Gloo of LibTorch 1.13 has no bfloat16 sum: the all-reduce would fail and poison the group.
    if (dtype_ == at::kBFloat16 && !compat::kGlooSumsBFloat16 && group.backend() == Backend::kGloo) {
      DDP_THROW(ConfigError, "ddp::bf16CompressHook: the gloo backend of this LibTorch cannot all-reduce bfloat16; "
                "use fp16CompressHook, or the shm or nccl backend");
    }
    // buffer.to(dtype).div_(world_size): cast first, divide in the wire dtype, as PyTorch does.
    at::Tensor wire = bucket.buffer().to(dtype_).div_(group.size());
    Work work = group.allReduceAsync(wire);
    return Work::then(std::move(work), [buffer = bucket.buffer(), wire]() mutable { buffer.copy_(wire); });
  }
  std::string name() const override { return dtype_ == at::kHalf ? "fp16" : "bf16"; }

 private:
  at::ScalarType dtype_;
};

// _orthogonalize_gram_schmidt: column by column, normalise, then remove it from the later columns.
void orthogonalizeGramSchmidt(at::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = matrices.narrow(2, i, 1);
    at::Tensor norm = at::linalg_vector_norm(col, 2, at::IntArrayRef{1}, /*keepdim=*/true);
    if (epsilon == 0) {
      col.div_(norm);
    } else {
      col.div_(norm + epsilon);
    }
    if (i + 1 < cols) {
      at::Tensor rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_(at::sum(col * rest, at::IntArrayRef{1}, /*keepdim=*/true) * col);
    }
  }
}

// _orthogonalize: Gram-Schmidt for rank ≤ 2 and half precision, QR (in place, as PyTorch) above.
void orthogonalize(at::Tensor& matrices, double epsilon) {
  const int64_t rank = matrices.size(2);
  const auto dtype = matrices.scalar_type();
  if (rank <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    orthogonalizeGramSchmidt(matrices, epsilon);
    return;
  }
  at::Tensor r = at::empty({matrices.size(0), rank, rank}, matrices.options());
  at::linalg_qr_out(matrices, r, matrices);
}

}  // namespace

std::shared_ptr<CommHook> allReduceHook() { return std::make_shared<AllReduceHook>(); }
std::shared_ptr<CommHook> fp16CompressHook() { return std::make_shared<CompressHook>(at::kHalf); }
std::shared_ptr<CommHook> bf16CompressHook() { return std::make_shared<CompressHook>(at::kBFloat16); }

struct PowerSgdHook::State {
  PowerSgdOptions options;
  std::mt19937 rng;  // numpy's RandomState(seed): the same MT19937 and the same seeding
  std::unordered_map<size_t, at::Tensor> error;
  std::unordered_map<size_t, at::Tensor> pMemory;
  std::unordered_map<size_t, at::Tensor> qMemory;
  int64_t iter = 0;
  int64_t before = 0;
  int64_t after = 0;
  mutable std::mutex mutex;

  // RandomState.randint(1_000_000_000): masked rejection sampling on 32-bit draws (numpy's legacy
  // bounded integers), which is what PowerSGDState's rng.randint does.
  int64_t randint() {
    constexpr uint32_t kRange = 999999999;  // high - low - 1
    constexpr uint32_t kMask = (1u << 30) - 1;  // smallest all-ones mask ≥ kRange
    uint32_t value = 0;
    do {
      value = static_cast<uint32_t>(rng()) & kMask;
    } while (value > kRange);
    return value;
  }

  void maybeIncreaseIter(bool isLast) {
    if (isLast) ++iter;
    if (iter == options.startPowerSgdIter && isLast) {
      spdlog::info("PowerSGD: compressing from iteration {} on", iter);
    }
  }
};

namespace {

using PowerSgdState = PowerSgdHook::State;

// One (batch, n, m) group of gradient matrices and its slices of the P and Q memory.
struct MatrixBatch {
  at::Tensor tensor;  // (batch, n, m): the matrix itself (unsqueezed) or a stack of several
  std::vector<at::Tensor> originals;  // filled back from a stack
  at::Tensor p;
  at::Tensor q;
};

// The bucket's gradients as powerSGD_hook sorts them: the matrices worth compressing, and the rest.
struct CompressionSplit {
  std::vector<at::Tensor> toCompress;  // (n, m) views into the bucket
  std::vector<at::Tensor> uncompressed;
  int64_t totalP = 0;  // elements of this bucket's P memory
  int64_t totalQ = 0;
};

// With error feedback: adds the error left by the last step (zeros the first time) and returns a
// copy of the input to compute the next error from.
at::Tensor addErrorFeedback(PowerSgdState& state, size_t index, at::Tensor& input) {
  auto found = state.error.find(index);
  if (found != state.error.end()) {
    input.add_(found->second);
  } else {
    state.error[index] = at::zeros({input.size(0)}, input.options());
  }
  return input.detach().clone();
}

// Step I: a matrix is compressed where (n + m) r elements times minCompressionRate are fewer than
// its n m; the elements before and after count into the compression stats.
CompressionSplit splitForCompression(PowerSgdState& state, const std::vector<at::Tensor>& gradients) {
  const PowerSgdOptions& o = state.options;
  CompressionSplit split;
  for (const at::Tensor& tensor : gradients) {
    const int64_t n = tensor.dim() > 0 ? tensor.size(0) : 1;
    at::Tensor matrix = matrixOf(tensor, n);
    const int64_t m = matrix.size(1);
    const int64_t r = std::min({n, m, o.matrixApproximationRank});
    const int64_t compressed = (n + m) * r;
    state.before += n * m;
    if (static_cast<double>(compressed) * o.minCompressionRate < static_cast<double>(n * m)) {
      split.toCompress.push_back(matrix);
      split.totalP += n * r;
      split.totalQ += m * r;
      state.after += compressed;
    } else {
      split.uncompressed.push_back(tensor);
      state.after += n * m;
    }
  }
  return split;
}

// Step II: the uncompressed tensors as one contiguous buffer for a single all-reduce.
at::Tensor flattenUncompressed(const std::vector<at::Tensor>& uncompressed, const at::TensorOptions& options) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : uncompressed) flat.push_back(t.reshape({-1}));
  return flat.empty() ? at::empty({0}, options) : at::cat(flat);
}

// The matrices grouped by shape in order of first appearance (PyTorch's defaultdict); a group of
// several becomes one stacked batch with batchTensorsWithSameShape, else each is a batch of one.
std::vector<MatrixBatch> batchByShape(const std::vector<at::Tensor>& toCompress, bool batchSameShape) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> byShape;
  for (const at::Tensor& matrix : toCompress) {
    const std::vector<int64_t> shape = matrix.sizes().vec();
    auto it = std::find_if(byShape.begin(), byShape.end(), [&](const auto& e) { return e.first == shape; });
    if (it == byShape.end()) {
      byShape.emplace_back(shape, std::vector<at::Tensor>{matrix});
    } else {
      it->second.push_back(matrix);
    }
  }
  std::vector<MatrixBatch> batches;
  for (const auto& [shape, matrices] : byShape) {
    if (batchSameShape && matrices.size() > 1) {
      batches.push_back(MatrixBatch{at::stack(matrices), matrices, {}, {}});
    } else {
      for (const at::Tensor& matrix : matrices) batches.push_back(MatrixBatch{matrix.unsqueeze(0), {}, {}, {}});
    }
  }
  return batches;
}

// Each batch's P (batch, n, r) and Q (batch, m, r) as consecutive views into the bucket's memory.
void viewFactors(std::vector<MatrixBatch>& batches, const at::Tensor& pMemory, const at::Tensor& qMemory,
                 int64_t rank) {
  int64_t pIndex = 0;
  int64_t qIndex = 0;
  for (MatrixBatch& b : batches) {
    const int64_t batch = b.tensor.size(0), n = b.tensor.size(1), m = b.tensor.size(2);
    const int64_t r = std::min({n, m, rank});
    b.p = pMemory.narrow(0, pIndex, batch * n * r).view({batch, n, r});
    b.q = qMemory.narrow(0, qIndex, batch * m * r).view({batch, m, r});
    pIndex += batch * n * r;
    qIndex += batch * m * r;
  }
}

// Orthogonal Qs: the warm-started ones as they are, else fresh from the state's seeded draws.
void initializeQs(PowerSgdState& state, std::vector<MatrixBatch>& batches, bool randomizeQs) {
  const double epsilon = state.options.orthogonalizationEpsilon;
  if (!randomizeQs) {
    for (MatrixBatch& b : batches) orthogonalize(b.q, epsilon);
    return;
  }
  // torch.manual_seed(rng.randint(1e9)) in a forked CPU generator, then randn per Q on the CPU.
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(state.randint()));
  for (MatrixBatch& b : batches) {
    b.q.copy_(at::randn(b.q.sizes(), generator, b.q.options().device(c10::kCPU)));
    orthogonalize(b.q, epsilon);
  }
}

// Step III: P and Q memory (kept across steps with warm start), viewed per batch, the Qs
// initialised and P = M Q computed locally.
std::vector<MatrixBatch> computeLocalPs(PowerSgdState& state, size_t index, const CompressionSplit& split,
                                        const at::TensorOptions& options) {
  const PowerSgdOptions& o = state.options;
  bool randomizeQs = false;
  if (!o.warmStart || !state.pMemory.count(index)) {
    randomizeQs = true;
    state.pMemory[index] = at::empty({split.totalP}, options);
    state.qMemory[index] = at::empty({split.totalQ}, options);
  }
  std::vector<MatrixBatch> batches = batchByShape(split.toCompress, o.batchTensorsWithSameShape);
  viewFactors(batches, state.pMemory[index], state.qMemory[index], o.matrixApproximationRank);
  initializeQs(state, batches, randomizeQs);
  for (MatrixBatch& b : batches) at::bmm_out(b.p, b.tensor, b.q);
  return batches;
}

// The all-reduced uncompressed buffer, averaged and copied back into its gradients.
void unpackUncompressed(at::Tensor& uncompressedMemory, std::vector<at::Tensor>& uncompressed, int64_t worldSize) {
  uncompressedMemory.div_(worldSize);
  int64_t offset = 0;
  for (at::Tensor& t : uncompressed) {
    t.copy_(uncompressedMemory.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

// All-reduce the Ps, orthogonalise them, Q = Mᵀ P, all-reduce the Qs, M = P Qᵀ, and copy stacked
// batches back into their gradients.
void reduceAndDecompress(PowerSgdState& state, ProcessGroup& group, size_t index, std::vector<MatrixBatch>& batches,
                         int64_t worldSize) {
  at::Tensor& pMemory = state.pMemory[index];
  at::Tensor& qMemory = state.qMemory[index];
  group.allReduce(pMemory);
  for (MatrixBatch& b : batches) orthogonalize(b.p, state.options.orthogonalizationEpsilon);
  for (MatrixBatch& b : batches) at::bmm_out(b.q, b.tensor.transpose(1, 2), b.p);
  group.allReduce(qMemory);
  qMemory.div_(worldSize);
  for (MatrixBatch& b : batches) at::bmm_out(b.tensor, b.p, b.q.transpose(1, 2));
  for (MatrixBatch& b : batches) {
    for (size_t i = 0; i < b.originals.size(); ++i) b.originals[i].copy_(b.tensor[static_cast<int64_t>(i)]);
  }
}

// Remember the error (with error feedback), drop the P and Q memory (without warm start), count
// the iteration.
void endBucket(PowerSgdState& state, size_t index, const at::Tensor& input, const at::Tensor& inputCopy,
               bool isLast) {
  const PowerSgdOptions& o = state.options;
  if (o.useErrorFeedback) state.error[index] = inputCopy - input;
  if (!o.warmStart) {
    state.pMemory.clear();
    state.qMemory.clear();
  }
  state.maybeIncreaseIter(isLast);
}

}  // namespace

PowerSgdHook::PowerSgdHook(PowerSgdOptions options) : state_(std::make_shared<State>()) {
  if (options.matrixApproximationRank < 1) {
    DDP_THROW(ConfigError, "ddp::PowerSgdOptions::matrixApproximationRank must be >= 1 (got ",
              options.matrixApproximationRank, ")");
  }
  if ((options.useErrorFeedback || options.warmStart) && options.startPowerSgdIter <= 1) {
    DDP_THROW(ConfigError, "ddp::PowerSgdOptions::startPowerSgdIter must be > 1 with useErrorFeedback or warmStart "
              "(got ", options.startPowerSgdIter, "): the first iterations run plain all-reduce, as PowerSGDState "
              "requires");
  }
  if (!(options.minCompressionRate >= 0) || !(options.orthogonalizationEpsilon >= 0)) {
    DDP_THROW(ConfigError, "ddp::PowerSgdOptions: minCompressionRate and orthogonalizationEpsilon must be >= 0");
  }
  state_->options = options;
  state_->rng.seed(options.randomSeed);
}

PowerSgdHook::~PowerSgdHook() = default;

int64_t PowerSgdHook::iteration() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->iter;
}

PowerSgdHook::Stats PowerSgdHook::compressionStats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  Stats stats;
  stats.elementsBefore = state_->before;
  stats.elementsAfter = state_->after;
  stats.rate = state_->after > 0 ? static_cast<double>(state_->before) / static_cast<double>(state_->after) : 0;
  return stats;
}

Work PowerSgdHook::run(GradBucket& bucket, ProcessGroup& group) {
  std::shared_ptr<State> state = state_;
  std::lock_guard<std::mutex> lock(state->mutex);
  const PowerSgdOptions& o = state->options;
  c10::NoGradGuard noGrad;
  const int64_t worldSize = group.size();
  at::Tensor input = bucket.buffer();
  if (state->iter < o.startPowerSgdIter) {
    state->maybeIncreaseIter(bucket.isLast());
    input.div_(worldSize);
    return group.allReduceAsync(input);
  }
  const size_t index = bucket.index();
  at::Tensor inputCopy;
  if (o.useErrorFeedback) inputCopy = addErrorFeedback(*state, index, input);
  CompressionSplit split = splitForCompression(*state, bucket.gradients());
  at::Tensor uncompressedMemory = flattenUncompressed(split.uncompressed, input.options());
  auto batches = std::make_shared<std::vector<MatrixBatch>>(computeLocalPs(*state, index, split, input.options()));

  Work first = group.allReduceAsync(uncompressedMemory);
  // What follows the uncompressed all-reduce, in order: unpack it, all-reduce the Ps, orthogonalise
  // them, Q = Mᵀ P, all-reduce the Qs, M = P Qᵀ, remember the error. Runs where the reducer waits
  // (in bucket order on every rank, so the collectives pair).
  auto rest = [state, group, index, worldSize, batches, input, inputCopy, uncompressedMemory,
               uncompressed = std::move(split.uncompressed), isLast = bucket.isLast()]() mutable {
    std::lock_guard<std::mutex> lock(state->mutex);
    c10::NoGradGuard noGrad;
    unpackUncompressed(uncompressedMemory, uncompressed, worldSize);
    reduceAndDecompress(*state, group, index, *batches, worldSize);
    endBucket(*state, index, input, inputCopy, isLast);
  };
  return Work::then(std::move(first), std::move(rest));
}

std::shared_ptr<PowerSgdHook> powerSgdHook(PowerSgdOptions options) {
  return std::make_shared<PowerSgdHook>(options);
}

}  // namespace ddp
