// Mistakes a user of the library makes, each one scenario (argv[1]) of a small training program run
// by misuse_test.sh under the real launcher: each must end in a ddp::Error with one line (printed
// here as "caught <type>: <what>", exit 3), never a crash or a rank that returns while another is
// left behind. argv[2]: the backend (gloo | shm | auto), argv[3]: the collectives' timeout in seconds.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

namespace {

struct ModelImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  ModelImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
};
TORCH_MODULE(Model);

int timeoutSeconds = 20;

ddp::ProcessGroup start(const std::string& backend) {
  ddp::InitOptions options;
  options.backend = ddp::parseBackend(backend).value();
  options.timeout = std::chrono::seconds(timeoutSeconds);  // a pairing bug must not hold the test for minutes
  return ddp::initProcessGroup(options);
}

void step(ddp::DistributedDataParallel<Model>& model, torch::optim::Optimizer& optimizer) {
  optimizer.zero_grad();
  model(torch::randn({8, 4})).pow(2).mean().backward();
  optimizer.step();
}

int run(const std::string& scenario, const std::string& backend) {
  torch::manual_seed(1);
  if (scenario == "null_group") {
    ddp::ProcessGroup group(nullptr);
    return 0;
  }
  if (scenario == "forget_set_epoch") {  // a LibTorch loader over two epochs, setEpoch forgotten
    ddp::DataLoaderSampler sampler(10, /*numReplicas=*/2, /*rank=*/0);
    auto data = torch::data::datasets::TensorDataset(torch::arange(10).unsqueeze(1));
    auto loader = torch::data::make_data_loader(data, sampler, torch::data::DataLoaderOptions(2));
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (auto& batch : *loader) (void)batch;
    }
    std::cout << "three passes done" << std::endl;
    return 0;
  }
  if (scenario == "before_group_fails_on_rank0") {  // rank 0 hosts the store and leaves on its error
    ddp::InitOptions options;
    options.backend = ddp::parseBackend(backend).value();
    options.timeout = std::chrono::seconds(timeoutSeconds);
    options.beforeGroup = [](const ddp::GroupStart& start) {
      if (start.rank() == 0) throw ddp::ConfigError("the model does not fit (a check of rank 0's own)");
    };
    ddp::ProcessGroup group = ddp::initProcessGroup(options);
    std::cout << "rank " << group.rank() << " made its group" << std::endl;
    return 0;
  }
  ddp::ProcessGroup group = start(backend);
  if (scenario == "recv_nobody_sends") {  // each rank waits for a message the other never sends
    torch::Tensor t = torch::zeros({4});
    group.recv(t, 1 - group.rank());
    group.destroy();
    std::cout << "rank " << group.rank() << " finished " << scenario << std::endl;
    return 0;
  }
  if (scenario == "new_group_of_other_ranks") {  // rank 0 names {0, 1}, rank 1 names {1}
    const std::vector<int> ranks = group.rank() == 0 ? std::vector<int>{0, 1} : std::vector<int>{1};
    (void)group.newGroup(ranks);
    std::cout << "rank " << group.rank() << " finished " << scenario << std::endl;
    return 0;
  }
  if (scenario == "moved_group") {
    ddp::ProcessGroup other = std::move(group);
    std::cout << "size " << group.size() << std::endl;  // NOLINT(bugprone-use-after-move): the mistake
    return 0;
  }
  Model net;
  ddp::DistributedDataParallel<Model> model(net, group);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  step(model, optimizer);
  if (scenario == "forward_after_destroy") {
    group.destroy();
    step(model, optimizer);
  } else if (scenario == "backward_after_destroy") {
    auto loss = model(torch::randn({8, 4})).pow(2).mean();
    group.destroy();
    loss.backward();
  } else if (scenario == "save_on_rank0_only") {
    if (group.rank() == 0) ddp::saveModel(*net, "misuse_model.pt", group);
    group.destroy();
  } else if (scenario == "extra_step_on_rank0") {
    if (group.rank() == 0) step(model, optimizer);
    group.destroy();
  } else if (scenario == "eval_on_rank0_only") {  // BatchNorm: the wrapper broadcasts buffers first
    if (group.rank() == 0) {
      torch::NoGradGuard noGrad;
      model(torch::randn({8, 4}));
    }
    group.destroy();
  } else if (scenario == "generators_of_one_process_in_two") {  // DataParallel's option in a 2-rank job
    ddp::CheckpointOptions options;
    options.dir = "misuse_checkpoints";
    options.cudaGenerators = {c10::Device(c10::kCPU)};
    ddp::Checkpointer checkpointer(group, options);
    checkpointer.save(*net, optimizer, ddp::TrainPosition{0, 1, 1, 16, -1});
  } else if (scenario == "clean") {
    group.destroy();
  } else {
    std::cerr << "unknown scenario " << scenario << std::endl;
    return 64;
  }
  std::cout << "rank " << group.rank() << " finished " << scenario << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: misuse_program SCENARIO [BACKEND]" << std::endl;
    return 64;
  }
  if (argc > 3) timeoutSeconds = std::atoi(argv[3]);
  try {
    return run(argv[1], argc > 2 ? argv[2] : "auto");
  } catch (const ddp::ConfigError& e) {
    std::cout << "caught ddp::ConfigError: " << e.what() << std::endl;
  } catch (const ddp::CommError& e) {
    std::cout << "caught ddp::CommError: " << e.what() << std::endl;
  } catch (const ddp::Error& e) {
    std::cout << "caught ddp::Error: " << e.what() << std::endl;
  } catch (const std::exception& e) {
    std::cout << "caught other: " << e.what() << std::endl;
  }
  return 3;
}
