// Fashion-MNIST through LibTorch's own data pipeline, data-parallel: torch::data::datasets::MNIST
// (Fashion-MNIST has MNIST's file format), torch::data::make_data_loader with worker threads, and
// ddp::DataLoaderSampler giving each rank its share in PyTorch's DistributedSampler order. The model
// is held as plain LibTorch programs hold it, in a std::shared_ptr.
//   ddp-launch --nproc_per_node=2 ./fashion_mnist_loader DATA_DIR [epochs=1] [model_path=fmnist_mlp.pt]
// DATA_DIR holds the four uncompressed files (train-images-idx3-ubyte, ...; `gunzip *.gz`).
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>

struct Mlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(28 * 28, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x.flatten(1)))); }
};

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fashion_mnist_loader DATA_DIR [epochs] [model_path]\n");
    return 2;
  }
  const std::string dataDir = argv[1];
  const int epochs = argc > 2 ? std::stoi(argv[2]) : 1;
  const std::string modelPath = argc > 3 ? argv[3] : "fmnist_mlp.pt";
  using torch::data::datasets::MNIST;
  namespace transforms = torch::data::transforms;

  ddp::ProcessGroup group = ddp::initProcessGroup();
  torch::manual_seed(0);  // the same start everywhere (DDP broadcasts rank 0's weights anyway)

  // Train: each rank its share, reshuffled every epoch (setEpoch), batches assembled by 2 threads.
  auto train = MNIST(dataDir, MNIST::Mode::kTrain)
                   .map(transforms::Normalize<>(0.2860, 0.3530))
                   .map(transforms::Stack<>());
  ddp::DataLoaderSampler sampler(static_cast<int64_t>(train.size().value()), group, {/*shuffle=*/true, /*seed=*/42});
  auto loader = torch::data::make_data_loader(std::move(train), sampler,  // the loader gets a copy
                                              torch::data::DataLoaderOptions(64).workers(2));

  auto net = std::make_shared<Mlp>();
  net->to(group.device());
  ddp::DistributedDataParallel model(net, group);  // DistributedDataParallel<std::shared_ptr<Mlp>>
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.setEpoch(epoch);  // reaches the loader's copy: without it every epoch has one order
    double lossSum = 0;
    int64_t steps = 0;
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(batch.data.to(group.device())), batch.target.to(group.device()));
      loss.backward();
      optimizer.step();
      lossSum += loss.item<double>();
      ++steps;
    }
    if (group.rank() == 0) std::printf("epoch %d: loss %.4f over %lld steps per rank\n", epoch, lossSum / steps,
                                       static_cast<long long>(steps));
  }

  // Test: every rank evaluates its share (no shuffle, no padding: each image once in all) with the
  // plain model, and the counts are summed; a rank evaluating alone would leave the others waiting.
  auto test = MNIST(dataDir, MNIST::Mode::kTest)
                  .map(transforms::Normalize<>(0.2860, 0.3530))
                  .map(transforms::Stack<>());
  const auto testSize = static_cast<int64_t>(test.size().value());
  ddp::DataLoaderSampler testSampler(testSize, group, {/*shuffle=*/false, /*seed=*/0, /*dropLast=*/true});
  auto testLoader = torch::data::make_data_loader(std::move(test), testSampler, torch::data::DataLoaderOptions(1000));
  net->eval();
  torch::NoGradGuard noGrad;
  auto counts = torch::zeros({2}, torch::kDouble);  // correct, seen
  for (auto& batch : *testLoader) {
    auto predicted = net->forward(batch.data.to(group.device())).argmax(1).cpu();
    counts[0] += predicted.eq(batch.target).sum().item<double>();
    counts[1] += static_cast<double>(batch.target.size(0));
  }
  group.allReduce(counts);
  if (group.rank() == 0) {
    std::printf("world %d: test accuracy %.4f (%lld images)\n", group.size(), counts[0].item<double>() / counts[1].item<double>(),
                static_cast<long long>(counts[1].item<double>()));
  }
  ddp::saveModel(*net, modelPath, group);  // rank 0 writes; Python's torch.load reads it
  group.destroy();                         // last: every rank leaves together
  return 0;
} catch (const ddp::Error& e) {  // what() is one line that says what is wrong and how to fix it
  std::fprintf(stderr, "fashion_mnist_loader: %s\n", e.what());
  return 1;
} catch (const c10::Error& e) {
  std::fprintf(stderr, "fashion_mnist_loader: %s\n", e.what_without_backtrace());
  return 1;
}
