#!/usr/bin/env python3
"""The reference for tests/libddp/recipes_test.cc, from PyTorch itself (the pinned wheel).

Reads one JSON object on stdin:
  {"schedules": [{"kind", "base_lr", "warmup_steps", "total_steps", "min_lr", "step_size", "gamma", "steps"}],
   "clip": [{"grads": [[...], ...] (flat float32 values), "shapes": [[...], ...], "max_norm": x}],
   "scaler": [{"init_scale", "growth_factor", "backoff_factor", "growth_interval", "lr", "params": [...],
               "steps": [{"g": [...], "bad": "none" | "inf" | "-inf" | "nan", "at": index}]}]}
and prints {"schedules": [[lr at step 0, 1, ...], ...], "clip": [{"norm": x, "grads": [[...], ...]}],
            "scaler": [{"scales": [...], "trackers": [...], "stepped": [...], "params": [...]}],
            "autocast": [{"dtype", "y", "loss_dtype", "loss"}]} for "autocast": [{"x", "x_shape", "w",
            "w_shape", "b", "dtype": "bf16" | "fp16"}] (linear + cross_entropy under torch.autocast("cpu")),
            "fused": [{"params", "scales", "steps"} per step] for "fused": [{"decoupled", "lr", "betas", "eps",
            "weight_decay", "amsgrad", "init_scale", "growth_interval", "params", "steps": [{"g", "bad",
            "at", "unscale"}]}] (torch.optim.AdamW/Adam(fused=True) on the CPU under GradScaler), and
            "fused_sgd_scaler": [{"params", "scales"}] for the same with SGD(fused=True) ("lr",
            "momentum", "dampening", "weight_decay", "nesterov" in place of Adam's options):
the lr that optimizer.param_groups[0]["lr"] holds after k calls of scheduler.step(), with the warm-up
as LinearLR(start_factor=1/(W+1), total_iters=W) chained by SequentialLR, and clip_grad_norm_'s
norm and clipped gradients, and torch.amp.GradScaler("cpu") driving SGD on loss = sum(p * g) (so the
scaled gradient is g × scale), a value of g made non-finite where "bad" says: the scale and growth
tracker after each update(), whether each step was taken, and the final parameters.
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


def scaler_run(c):
    p = torch.nn.Parameter(torch.tensor(c["params"], dtype=torch.float32))
    opt = SGD([p], lr=c["lr"])
    scaler = torch.amp.GradScaler("cpu", init_scale=c["init_scale"], growth_factor=c["growth_factor"],
                                  backoff_factor=c["backoff_factor"], growth_interval=c["growth_interval"])
    out = {"scales": [], "trackers": [], "stepped": []}
    for step in c["steps"]:
        g = torch.tensor(step["g"], dtype=torch.float32)
        if step["bad"] != "none":
            g[step["at"]] = float(step["bad"])
        opt.zero_grad()
        scaler.scale((p * g).sum()).backward()
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        out["stepped"].append(not torch.equal(before, p.detach()))
        out["scales"].append(scaler.get_scale())
        out["trackers"].append(int(scaler._get_growth_tracker()))
    out["params"] = p.detach().tolist()
    return out


def autocast_run(c):
    x = torch.tensor(c["x"], dtype=torch.float32).reshape(c["x_shape"])
    w = torch.tensor(c["w"], dtype=torch.float32).reshape(c["w_shape"])
    b = torch.tensor(c["b"], dtype=torch.float32)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[c["dtype"]]
    with torch.autocast("cpu", dtype=dtype):
        y = torch.nn.functional.linear(x, w, b)
        loss = torch.nn.functional.cross_entropy(y, torch.zeros(y.shape[0], dtype=torch.long))
    return {"dtype": str(y.dtype).replace("torch.", ""), "y": y.float().flatten().tolist(),
            "loss_dtype": str(loss.dtype).replace("torch.", ""), "loss": float(loss)}


def fused_run(c):
    """AdamW(fused=True) (or Adam) on CPU under GradScaler: params after each step."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.tensor(c["params"], dtype=torch.float32))
    cls = torch.optim.AdamW if c["decoupled"] else torch.optim.Adam
    opt = cls([p], lr=c["lr"], betas=tuple(c["betas"]), eps=c["eps"], weight_decay=c["weight_decay"],
              amsgrad=c["amsgrad"], fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=c["init_scale"], growth_interval=c["growth_interval"])
    out = {"params": [], "scales": [], "steps": []}
    for step in c["steps"]:
        g = torch.tensor(step["g"], dtype=torch.float32)
        if step["bad"] != "none":
            g[step["at"]] = float(step["bad"])
        opt.zero_grad()
        scaler.scale((p * g).sum()).backward()
        if step["unscale"]:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        out["params"].append(p.detach().tolist())
        out["scales"].append(scaler.get_scale())
        out["steps"].append(float(opt.state[p]["step"]) if p in opt.state else 0.0)
    return out


def fused_sgd_run(c):
    """torch.optim.SGD(fused=True) with a tensor learning rate changed between steps and found_inf
    set as GradScaler sets it for fused optimizers (a flagged step is skipped inside the kernel)."""
    p = torch.tensor(c["params"], dtype=torch.float32, requires_grad=True)
    opt = torch.optim.SGD([p], lr=torch.tensor(c["lrs"][0]), momentum=c["momentum"], dampening=c["dampening"],
                          weight_decay=c["weight_decay"], nesterov=c["nesterov"], fused=True)
    out = {"params": []}
    for step in c["steps"]:
        opt.param_groups[0]["lr"].fill_(step["lr"])
        p.grad = torch.tensor(step["g"], dtype=torch.float32)
        opt.grad_scale = None
        opt.found_inf = torch.tensor(1.0 if step["skip"] else 0.0)
        opt.step()
        out["params"].append(p.detach().tolist())
    return out


def fused_sgd_scaler_run(c):
    """SGD(fused=True) on CPU under GradScaler (the kernel unscales and skips): params and scale after
    each step."""
    p = torch.nn.Parameter(torch.tensor(c["params"], dtype=torch.float32))
    opt = torch.optim.SGD([p], lr=c["lr"], momentum=c["momentum"], dampening=c["dampening"],
                          weight_decay=c["weight_decay"], nesterov=c["nesterov"], fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=c["init_scale"], growth_interval=c["growth_interval"])
    out = {"params": [], "scales": []}
    for step in c["steps"]:
        g = torch.tensor(step["g"], dtype=torch.float32)
        if step["bad"] != "none":
            g[step["at"]] = float(step["bad"])
        opt.zero_grad()
        scaler.scale((p * g).sum()).backward()
        if step["unscale"]:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        out["params"].append(p.detach().tolist())
        out["scales"].append(scaler.get_scale())
    return out


def main():
    request = json.load(sys.stdin)
    out = {"schedules": [schedule_lrs(s) for s in request.get("schedules", [])],
           "clip": [clip(c) for c in request.get("clip", [])],
           "scaler": [scaler_run(c) for c in request.get("scaler", [])],
           "autocast": [autocast_run(c) for c in request.get("autocast", [])],
           "fused": [fused_run(c) for c in request.get("fused", [])],
           "fused_sgd": [fused_sgd_run(c) for c in request.get("fused_sgd", [])],
           "fused_sgd_scaler": [fused_sgd_scaler_run(c) for c in request.get("fused_sgd_scaler", [])]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
