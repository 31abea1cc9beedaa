// ddp::FusedAdamW: torch.optim.AdamW(fused=True) (and Adam(fused=True)) for LibTorch programs, whose
// step takes the GradScaler's scale and found-inf flag on the device: no host synchronisation per
// step, as Python's GradScaler gets from fused optimizers.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/optim/optimizer.h>

#include <unordered_map>
#include <vector>

namespace ddp {

/// An optimizer whose update is one kernel that takes a loss scaler's tensors and the learning rate
/// on the device (PyTorch's `_step_supports_amp_scaling` optimizers: fused=True): ddp::GradScaler
/// hands it the scale and the found-inf flag instead of reading the flag on the host, and a CUDA
/// graph captures its step. ddp::FusedAdamW and ddp::FusedSGD are ones.
class FusedOptimizer {
 public:
  virtual ~FusedOptimizer() = default;
  /// The step with `gradScale` (undefined when the gradients are already unscaled) dividing the
  /// gradients inside the kernel, `foundInf` (undefined: none; a 0-dim float tensor) nonzero making
  /// the step a no-op on the device, and `lr` (undefined: each group's lr) a 0-dim tensor read on
  /// the device. Nothing here waits for the device.
  virtual void fusedStep(const at::Tensor& gradScale, const at::Tensor& foundInf, const at::Tensor& lr) = 0;
};

struct FusedAdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 1e-2;  // decoupled (AdamW); with decoupledWeightDecay false: Adam's L2 term
  bool amsgrad = false;
  bool decoupledWeightDecay = true;  // false: torch.optim.Adam(fused=True)
};

/// One parameter's state, as Python's fused Adam keeps it: the moments in the parameter's dtype
/// and device, `step` a float32 0-dim tensor on the same device (so a skipped step is undone on the
/// device).
struct FusedAdamWState {
  at::Tensor expAvg;
  at::Tensor expAvgSq;
  at::Tensor maxExpAvgSq;  // amsgrad only
  at::Tensor step;
};

/// AdamW with LibTorch's fused kernel (_fused_adamw_, or _fused_adam_ for Adam): one call per
/// device and dtype updates every parameter. The same update as torch.optim.AdamW(fused=True), to
/// the bit on the same LibTorch (test api_recipes). Runs where LibTorch has the kernel: CUDA, and
/// CPU with LibTorch 2.x (`available()`); elsewhere construction throws ConfigError. The parameter
/// groups' options are AdamWOptions, so ddp::LrSchedule::apply sets their lr as for any optimizer.
/// ddp::GradScaler::step hands it the scale and the found-inf flag: the kernel unscales the
/// gradients itself and skips a step whose gradients are not finite, all on the device.
class FusedAdamW : public torch::optim::Optimizer, public FusedOptimizer {
 public:
  explicit FusedAdamW(const std::vector<at::Tensor>& params, FusedAdamWOptions options = {});

  /// Whether this LibTorch has the fused kernel for `deviceType`.
  static bool available(c10::DeviceType deviceType);

  /// optimizer.step() (a closure, if given, is called first with grad enabled, as in PyTorch).
  at::Tensor step(LossClosure closure = nullptr) override;
  /// The step with a loss scaler's tensors: `gradScale` (undefined when the gradients are already
  /// unscaled) divides the gradients inside the kernel; `foundInf` (undefined: none) nonzero makes
  /// the step a no-op on the device, its step counts included.
  void step(const at::Tensor& gradScale, const at::Tensor& foundInf);
  /// The same with the learning rate as a 0-dim tensor read on the device (torch's
  /// `lr=torch.tensor(...)` with fused=True): a CUDA graph replays the step with the value the
  /// tensor holds then. The groups' own lr is not used.
  void step(const at::Tensor& gradScale, const at::Tensor& foundInf, const at::Tensor& lr);
  void fusedStep(const at::Tensor& gradScale, const at::Tensor& foundInf, const at::Tensor& lr) override {
    step(gradScale, foundInf, lr);
  }

  /// The state of `param` (nullptr before its first step), and installing one (checkpoints).
  const FusedAdamWState* stateOf(const at::Tensor& param) const;
  void setStateOf(const at::Tensor& param, FusedAdamWState state);
  bool decoupledWeightDecay() const { return decoupled_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  bool decoupled_;
  std::unordered_map<const c10::TensorImpl*, FusedAdamWState> states_;
};

/// Whether this LibTorch has torch.optim.SGD(fused=True)'s kernel (2.x; on CUDA and CPU).
bool fusedSgdAvailable();

/// torch.optim.SGD(fused=True) for LibTorch programs: a torch::optim::SGD (the same options, the
/// momentum buffers in its state, so checkpoints, ddp::LrSchedule and ddp::Checkpointer treat it as
/// SGD) whose step is one _fused_sgd_ kernel per device and dtype instead of a few kernels per
/// parameter. Under ddp::GradScaler the kernel unscales the gradients and skips a non-finite step
/// on the device, as PyTorch's GradScaler does with fused optimizers. The update equals
/// torch.optim.SGD(fused=True)'s to the bit on the same LibTorch (test api_recipes), and SGD's
/// within float rounding (the kernel's fused multiply-adds). Construction throws ConfigError where
/// the kernel is missing (LibTorch 1.13, or a device other than CUDA and CPU).
class FusedSGD : public torch::optim::SGD, public FusedOptimizer {
 public:
  FusedSGD(const std::vector<at::Tensor>& params, torch::optim::SGDOptions options);

  /// Whether this LibTorch has the kernel for `deviceType`.
  static bool available(c10::DeviceType deviceType);

  /// optimizer.step() (a closure, if given, is called first with grad enabled, as in PyTorch).
  at::Tensor step(LossClosure closure = nullptr) override;
  /// The step with a loss scaler's tensors and, when defined, the learning rate on the device
  /// (as FusedOptimizer::fusedStep).
  void step(const at::Tensor& gradScale, const at::Tensor& foundInf, const at::Tensor& lr = {});
  void fusedStep(const at::Tensor& gradScale, const at::Tensor& foundInf, const at::Tensor& lr) override {
    step(gradScale, foundInf, lr);
  }
};

/// torch.optim.SGD(fused=True)'s step for a LibTorch SGD optimizer: one _fused_sgd_ kernel per
/// device and dtype over its parameters and momentum buffers (kept in `sgd`'s state, where
/// checkpoints find them; made on the first step, as PyTorch does), with the learning rate as a 0-dim
/// tensor read on the device and `foundInf` (undefined: none) nonzero making the step a no-op there.
/// Nothing waits for the device, so a CUDA graph can capture it; except a parameter's first step
/// (no buffer yet) with dampening and `foundInf` defined, which reads the flag on the host to make
/// no buffer for a skipped step, as torch.optim.SGD makes none. The update equals SGD's within
/// float rounding (the kernel's fused multiply-adds). ConfigError on LibTorch 1.13.
void fusedSgdStep(torch::optim::SGD& sgd, const at::Tensor& lr, const at::Tensor& foundInf = {});
/// The same with a loss scaler's scale (undefined: none) dividing the gradients inside the kernel,
/// and `lr` undefined meaning each group's own lr.
void fusedSgdStep(torch::optim::SGD& sgd, const at::Tensor& lr, const at::Tensor& foundInf, const at::Tensor& gradScale);

}  // namespace ddp
