#include "worker/models/resnet.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>

#include "common/error.h"
#include "ddp/sync_batch_norm.h"

namespace ddp::worker {
namespace F = torch::nn::functional;
namespace {

struct Layout {
  bool bottleneck;
  int64_t blocks[4];
};

Layout layoutOf(const std::string& depth) {
  if (depth == "resnet18") return {false, {2, 2, 2, 2}};
  if (depth == "resnet34") return {false, {3, 4, 6, 3}};
  if (depth == "resnet50") return {true, {3, 4, 6, 3}};
  DDP_THROW(ConfigError, "config: 'model.name' is '", depth, "'; the ResNets are resnet18, resnet34 and resnet50");
}

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

// BatchNorm2d, or ddp::SyncBatchNorm over `group` (the same parameter and buffer names).
torch::nn::AnyModule norm(int64_t channels, const std::shared_ptr<ProcessGroup>& group) {
  if (group) return torch::nn::AnyModule(SyncBatchNorm(channels, *group));
  return torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
}

// norm(), registered in `parent` as `name`.
torch::nn::AnyModule registerNorm(torch::nn::Module& parent, const std::string& name, int64_t channels,
                                  const std::shared_ptr<ProcessGroup>& group) {
  if (group) return torch::nn::AnyModule(parent.register_module(name, SyncBatchNorm(channels, *group)));
  return torch::nn::AnyModule(parent.register_module(name, torch::nn::BatchNorm2d(channels)));
}

}  // namespace

bool isResNet(const std::string& name) { return name == "resnet18" || name == "resnet34" || name == "resnet50"; }

ResidualBlockImpl::ResidualBlockImpl(bool bottleneck, int64_t inplanes, int64_t planes, int64_t stride,
                                     std::shared_ptr<ProcessGroup> syncGroup)
    : bottleneck_(bottleneck), inplanes_(inplanes), planes_(planes), stride_(stride), syncGroup_(std::move(syncGroup)) {
  reset();
}

void ResidualBlockImpl::reset() {
  const int64_t expansion = bottleneck_ ? 4 : 1;
  if (bottleneck_) {  // torchvision's Bottleneck (v1.5): the stride on the 3x3 convolution
    conv1_ = register_module("conv1", conv(inplanes_, planes_, 1, 1));
    bn1_ = registerNorm(*this, "bn1", planes_, syncGroup_);
    conv2_ = register_module("conv2", conv(planes_, planes_, 3, stride_));
    bn2_ = registerNorm(*this, "bn2", planes_, syncGroup_);
    conv3_ = register_module("conv3", conv(planes_, planes_ * 4, 1, 1));
    bn3_ = registerNorm(*this, "bn3", planes_ * 4, syncGroup_);
  } else {
    conv1_ = register_module("conv1", conv(inplanes_, planes_, 3, stride_));
    bn1_ = registerNorm(*this, "bn1", planes_, syncGroup_);
    conv2_ = register_module("conv2", conv(planes_, planes_, 3, 1));
    bn2_ = registerNorm(*this, "bn2", planes_, syncGroup_);
  }
  if (stride_ != 1 || inplanes_ != planes_ * expansion) {
    torch::nn::Sequential down;
    down->push_back("0", conv(inplanes_, planes_ * expansion, 1, stride_));
    down->push_back("1", norm(planes_ * expansion, syncGroup_));
    downsample_ = register_module("downsample", down);
  }
}

at::Tensor ResidualBlockImpl::forward(at::Tensor x) {
  at::Tensor out = F::relu(bn1_.forward(conv1_->forward(x)));
  out = bn2_.forward(conv2_->forward(out));
  if (bottleneck_) out = bn3_.forward(conv3_->forward(F::relu(out)));
  const at::Tensor identity = downsample_ ? downsample_->forward(x) : x;
  return F::relu(out + identity);
}

ResNetImpl::ResNetImpl(ResNetOptions options, const ProcessGroup* syncGroup)
    : options_(std::move(options)),
      syncGroup_(syncGroup != nullptr ? std::make_shared<ProcessGroup>(*syncGroup) : nullptr) {
  reset();
}

void ResNetImpl::reset() {
  const Layout layout = layoutOf(options_.depth);
  const int64_t expansion = layout.bottleneck ? 4 : 1;
  conv1_ = register_module("conv1", conv(options_.inChannels, 64, 7, 2));
  bn1_ = registerNorm(*this, "bn1", 64, syncGroup_);
  int64_t inplanes = 64;
  torch::nn::Sequential* layers[4] = {&layer1_, &layer2_, &layer3_, &layer4_};
  for (int l = 0; l < 4; ++l) {
    const int64_t planes = 64LL << l;
    torch::nn::Sequential layer;
    for (int64_t b = 0; b < layout.blocks[l]; ++b) {
      const int64_t stride = (l > 0 && b == 0) ? 2 : 1;
      layer->push_back(std::to_string(b), ResidualBlock(layout.bottleneck, inplanes, planes, stride, syncGroup_));
      inplanes = planes * expansion;
    }
    *layers[l] = register_module("layer" + std::to_string(l + 1), layer);
  }
  fc_ = register_module("fc", torch::nn::Linear(512 * expansion, options_.classes));
  // torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu") for every Conv2d; BatchNorm
  // weight 1, bias 0 (LibTorch's defaults too); the Linear keeps PyTorch's default initialisation.
  torch::NoGradGuard noGrad;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
}

at::Tensor ResNetImpl::forward(at::Tensor x) {
  x = F::relu(bn1_.forward(conv1_->forward(x)));
  x = F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
  torch::nn::Sequential* stages[4] = {&layer1_, &layer2_, &layer3_, &layer4_};
  for (size_t i = 0; i < 4; ++i) {
    x = runUnit(i, [stage = stages[i]->ptr()](const at::Tensor& in) { return stage->forward(in); }, x);
  }
  x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
  return fc_->forward(x);
}

std::vector<torch::nn::Module*> ResNetImpl::unitModules() {
  return {layer1_.get(), layer2_.get(), layer3_.get(), layer4_.get()};
}

double resNetParameterCount(const std::string& depth, int64_t inChannels, int64_t classes) {
  const Layout layout = layoutOf(depth);
  const int64_t expansion = layout.bottleneck ? 4 : 1;
  double count = static_cast<double>(inChannels) * 64 * 49 + 2 * 64;  // conv1, bn1
  int64_t inplanes = 64;
  for (int l = 0; l < 4; ++l) {
    const int64_t planes = 64LL << l;
    for (int64_t b = 0; b < layout.blocks[l]; ++b) {
      const int64_t stride = (l > 0 && b == 0) ? 2 : 1;
      const auto p = static_cast<double>(planes);
      const auto in = static_cast<double>(inplanes);
      if (layout.bottleneck) count += in * p + 2 * p + p * p * 9 + 2 * p + p * 4 * p + 2 * 4 * p;
      else count += in * p * 9 + 2 * p + p * p * 9 + 2 * p;
      if (stride != 1 || inplanes != planes * expansion) count += in * p * expansion + 2 * p * expansion;
      inplanes = planes * expansion;
    }
  }
  return count + static_cast<double>(512 * expansion) * static_cast<double>(classes) + static_cast<double>(classes);
}

}  // namespace ddp::worker
