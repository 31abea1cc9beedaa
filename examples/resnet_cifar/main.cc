// A small ResNet trained with DistributedDataParallel on CIFAR-shaped data it makes itself
// (3x32x32 images, 10 classes: each class is a fixed random pattern plus noise), with a modern
// recipe: AdamW, a linear warm-up then a cosine decay (ddp::LrSchedule), gradient clipping
// (ddp::clipGradNorm) and bf16 mixed precision (ddp::Autocast; fp16 would add a ddp::GradScaler).
//   ddp-launch --nproc_per_node=2 ./resnet_cifar [epochs=5] [output_dir=resnet_cifar_out]
// Resumes from output_dir/checkpoints when run again; writes output_dir/model.pt on rank 0.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

struct BlockImpl : torch::nn::Module {
  torch::nn::Conv2d conv1, conv2;
  torch::nn::BatchNorm2d bn1, bn2;
  explicit BlockImpl(int64_t c)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(c))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(c))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::relu(x + bn2(conv2(torch::relu(bn1(conv1(x))))));
  }
};
TORCH_MODULE(Block);

struct ResNetImpl : torch::nn::Module {
  torch::nn::Conv2d stem{nullptr};
  torch::nn::Sequential blocks;
  torch::nn::Linear head{nullptr};
  explicit ResNetImpl(int64_t width = 16, int64_t classes = 10) {
    stem = register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, width, 3).stride(2).padding(1)));
    blocks = register_module("blocks", torch::nn::Sequential(Block(width), Block(width)));
    head = register_module("head", torch::nn::Linear(width, classes));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = blocks->forward(torch::relu(stem(x)));
    return head(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
};
TORCH_MODULE(ResNet);

// The same data on every rank (same seed): the sampler gives each rank its share.
std::pair<torch::Tensor, torch::Tensor> makeData(int64_t n, const torch::Tensor& patterns, uint64_t seed) {
  torch::manual_seed(seed);
  auto y = torch::randint(0, patterns.size(0), {n}, torch::kLong);
  auto x = patterns.index_select(0, y) + 0.8 * torch::randn({n, 3, 32, 32});
  return {x, y};
}

int main(int argc, char** argv) try {
  const int64_t epochs = argc > 1 ? std::stoll(argv[1]) : 5;
  const std::string out = argc > 2 ? argv[2] : "resnet_cifar_out";
  ddp::ProcessGroup group = ddp::initProcessGroup();
  torch::manual_seed(0);
  const auto patterns = torch::randn({10, 3, 32, 32});
  auto [trainX, trainY] = makeData(2048, patterns, 1);
  auto [testX, testY] = makeData(512, patterns, 2);

  ResNet net;
  net->to(group.device());
  ddp::DistributedDataParallel<ResNet> model(net, group);  // rank 0's initial weights everywhere
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(0.01));
  // A warm-up, then a cosine decay over 8 epochs' steps: fixed, so that a run extended to more
  // epochs resumes on the same curve.
  const int64_t stepsPerEpoch = (trainX.size(0) / group.size() + 31) / 32;
  ddp::LrScheduleOptions lr;
  lr.kind = ddp::LrDecay::kCosine;
  lr.baseLr = 2e-3;
  lr.warmupSteps = 20;
  lr.totalSteps = 8 * stepsPerEpoch;
  lr.minLr = 1e-4;
  const ddp::LrSchedule schedule(lr);
  ddp::Checkpointer checkpoints(group, {out + "/checkpoints"});
  const ddp::TrainPosition start = checkpoints.resume(*net, optimizer).value_or(ddp::TrainPosition{});

  ddp::DistributedSampler sampler(trainX.size(0), group, {/*shuffle=*/true, /*seed=*/7});
  int64_t step = start.globalStep;
  for (int64_t epoch = start.epoch; epoch < epochs; ++epoch) {
    sampler.setEpoch(epoch);  // a new shuffle each epoch, the same on every rank
    net->train();
    double lossSum = 0;
    const auto batches = sampler.batches(32);
    for (const auto& batch : batches) {
      const auto index = torch::tensor(batch, torch::kLong);
      const auto x = trainX.index_select(0, index).to(group.device());
      const auto y = trainY.index_select(0, index).to(group.device());
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        // The forward and the loss in bfloat16 where it pays (convolutions, matmuls); the weights,
        // gradients and optimizer state stay float32. Backward runs outside, as with torch.autocast.
        ddp::Autocast bf16(group.device().type(), torch::kBFloat16);
        loss = torch::nn::functional::cross_entropy(model.forward(x), y);
      }
      loss.backward();  // gradients averaged over the ranks during backward
      ddp::clipGradNorm(net->parameters(), 1.0);  // the averaged gradients: the same on every rank
      schedule.apply(optimizer, step);
      optimizer.step();
      lossSum += loss.item<double>();
      ++step;
    }
    auto meanLoss = torch::tensor({lossSum / static_cast<double>(batches.size())});
    group.allReduce(meanLoss, ddp::ReduceOp::kAvg);
    checkpoints.save(*net, optimizer, {epoch + 1, 0, step, 0});
    if (group.rank() == 0) std::printf("epoch %lld: loss %.4f\n", static_cast<long long>(epoch), meanLoss.item<double>());
  }

  // Accuracy on the whole test set: each rank counts its shard (no padding), then one sum.
  torch::NoGradGuard noGrad;
  net->eval();
  ddp::DistributedSampler testSampler(testX.size(0), group, {/*shuffle=*/false, 0, /*dropLast=*/false});
  auto counts = torch::zeros({2}, torch::kDouble);
  std::vector<int64_t> mine;
  for (int64_t i : testSampler.indices()) {
    if (static_cast<int64_t>(mine.size()) * group.size() + group.rank() >= testX.size(0)) break;  // padding
    mine.push_back(i);
  }
  const auto index = torch::tensor(mine, torch::kLong);
  const auto predicted = net->forward(testX.index_select(0, index).to(group.device())).argmax(1).cpu();
  counts[0] = predicted.eq(testY.index_select(0, index)).sum().item<double>();
  counts[1] = static_cast<double>(mine.size());
  group.allReduce(counts);
  ddp::saveModel(*net, out + "/model.pt", group);  // plain keys, CPU tensors: torch.load reads it
  if (group.rank() == 0) {
    std::printf("test accuracy %.4f (%lld samples), world %d, backend %s\n",
                counts[0].item<double>() / counts[1].item<double>(), static_cast<long long>(counts[1].item<double>()),
                group.size(), ddp::backendName(group.backend()));
  }
  group.destroy();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "resnet_cifar: %s\n", e.what());
  return 1;
}
