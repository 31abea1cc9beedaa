#!/usr/bin/env python3
"""The reference for tests/libddp/recipes_test.cc, from PyTorch itself (the pinned wheel).

Reads one JSON object on stdin:
  {"schedules": [{"kind", "base_lr", "warmup_steps", "total_steps", "min_lr", "step_size", "gamma", "steps"}],
   "clip": [{"grads": [[...], ...] (flat float32 values), "shapes": [[...], ...], "max_norm": x}]}
and prints {"schedules": [[lr at step 0, 1, ...], ...], "clip": [{"norm": x, "grads": [[...], ...]}]}:
the lr that optimizer.param_groups[0]["lr"] holds after k calls of scheduler.step(), with the warm-up
as LinearLR(start_factor=1/(W+1), total_iters=W) chained by SequentialLR, and clip_grad_norm_'s
norm and clipped gradients.
"""
import json
import sys

import torch
from torch.optim import SGD
from torch.optim.lr_scheduler import (ConstantLR, CosineAnnealingLR, LinearLR, SequentialLR, StepLR)


def schedule_lrs(s):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = SGD([param], lr=s["base_lr"])
    w, total = s["warmup_steps"], s["total_steps"]
    kind = s["kind"]
    if kind == "constant":
        after = ConstantLR(opt, factor=1.0, total_iters=0)
    elif kind == "step":
        after = StepLR(opt, step_size=s["step_size"], gamma=s["gamma"])
    elif kind == "cosine":
        after = CosineAnnealingLR(opt, T_max=total - w, eta_min=s["min_lr"])
    elif kind == "linear":
        after = LinearLR(opt, start_factor=1.0, end_factor=s["min_lr"] / s["base_lr"], total_iters=total - w)
    else:
        raise ValueError(kind)
    if w > 0:
        warm = LinearLR(opt, start_factor=1.0 / (w + 1), end_factor=1.0, total_iters=w)
        sched = SequentialLR(opt, schedulers=[warm, after], milestones=[w])
    else:
        sched = after
    lrs = []
    for _ in range(s["steps"]):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def clip(c):
    params = []
    for values, shape in zip(c["grads"], c["shapes"]):
        p = torch.nn.Parameter(torch.zeros(shape))
        p.grad = torch.tensor(values, dtype=torch.float32).reshape(shape)
        params.append(p)
    norm = torch.nn.utils.clip_grad_norm_(params, c["max_norm"])
    return {"norm": float(norm), "grads": [p.grad.flatten().tolist() for p in params]}


def main():
    request = json.load(sys.stdin)
    out = {"schedules": [schedule_lrs(s) for s in request.get("schedules", [])],
           "clip": [clip(c) for c in request.get("clip", [])]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
