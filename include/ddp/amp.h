// Mixed precision for LibTorch programs: ddp::Autocast (torch.autocast) and ddp::GradScaler
// (torch.amp.GradScaler, which LibTorch lacks), the latter aware of the process group so that every
// rank skips the same steps and keeps the same scale.
//
//   ddp::GradScaler scaler(group);                        // fp16: init scale 2^16, growth 2, backoff 0.5
//   for (batch ...) {
//     optimizer.zero_grad();
//     at::Tensor loss;
//     { ddp::Autocast autocast(group.device().type(), at::kHalf);  // forward and loss only
//       loss = criterion(model.forward(x), y); }
//     scaler.scale(loss).backward();                     // DDP averages the scaled gradients
//     scaler.unscale_(optimizer);                        // optional: before clipping
//     ddp::clipGradNorm(params, 1.0);
//     scaler.step(optimizer);                            // skipped when a gradient overflowed
//     scaler.update();
//   }
//
// bf16 needs no scaler: ddp::Autocast(device_type, at::kBFloat16) around the forward is all.
#pragma once

#include "ddp/autocast.h"     // ddp::Autocast
#include "ddp/grad_scaler.h"  // ddp::GradScaler, GradScalerOptions, GradScalerState
#include "ddp/non_finite.h"   // ddp::nonFiniteFlag, ddp::NonFiniteSteps
