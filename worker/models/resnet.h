// torchvision's ResNet (torchvision/models/resnet.py): resnet18 and resnet34 (BasicBlock), resnet50
// (Bottleneck), with its module names, so the export loads into torchvision.models.resnet18(
// num_classes=C) with load_state_dict(strict=True), and its initialisation (Kaiming normal, fan_out,
// for the convolutions; BatchNorm weight 1, bias 0; Linear as PyTorch's default). The BatchNorm
// layers are ddp::SyncBatchNorm over a group when one is given (model.sync_batch_norm).
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>

#include "ddp/process_group.h"
#include "worker/models/sharded_units.h"

namespace ddp::worker {

struct ResNetOptions {
  std::string depth = "resnet18";  // resnet18 | resnet34 | resnet50
  int64_t inChannels = 3;
  int64_t classes = 1000;
};

/// Whether `name` is a ResNet this file builds (resnet18, resnet34, resnet50).
bool isResNet(const std::string& name);

/// One residual block: BasicBlock (two 3x3 convolutions) or Bottleneck (1x1, 3x3 with the stride,
/// 1x1 to 4x the width), each convolution followed by BatchNorm; `downsample` (1x1 convolution with
/// the stride + BatchNorm) where the shape changes.
class ResidualBlockImpl : public torch::nn::Cloneable<ResidualBlockImpl> {
 public:
  ResidualBlockImpl(bool bottleneck, int64_t inplanes, int64_t planes, int64_t stride,
                    std::shared_ptr<ProcessGroup> syncGroup);
  void reset() override;
  at::Tensor forward(at::Tensor x);

 private:
  bool bottleneck_;
  int64_t inplanes_, planes_, stride_;
  std::shared_ptr<ProcessGroup> syncGroup_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::AnyModule bn1_, bn2_, bn3_;
  torch::nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(ResidualBlock);

/// conv1 (7x7, stride 2) → bn1 → ReLU → max pool (3, stride 2) → layer1..layer4 → global average
/// pool → fc. Any input of at least 32 x 32 (ImageNet's 224 x 224 as torchvision's).
/// train.sharding full: layer1..layer4 one unit each (conv1, bn1 and fc stay with the root).
class ResNetImpl : public torch::nn::Cloneable<ResNetImpl>, public ShardedUnits {
 public:
  explicit ResNetImpl(ResNetOptions options, const ProcessGroup* syncGroup = nullptr);
  void reset() override;
  at::Tensor forward(at::Tensor x);
  std::vector<torch::nn::Module*> unitModules() override;

 private:
  ResNetOptions options_;
  std::shared_ptr<ProcessGroup> syncGroup_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::AnyModule bn1_;
  torch::nn::Sequential layer1_{nullptr}, layer2_{nullptr}, layer3_{nullptr}, layer4_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(ResNet);

/// Parameters of the ResNet `depth` for `inChannels` and `classes` (its formula, for the size check).
double resNetParameterCount(const std::string& depth, int64_t inChannels, int64_t classes);

}  // namespace ddp::worker
