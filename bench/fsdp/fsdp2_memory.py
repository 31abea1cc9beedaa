#!/usr/bin/env python3
"""The PyTorch side of bench/fsdp: fsdp_memory_bench.cc's model and measurements with DDP,
ZeroRedundancyOptimizer (ZeRO-1), FSDP2's fully_shard (each block, then the root; a CPU
DeviceMesh over Gloo) and, for zero2, fully_shard with reshard_after_forward=False: PyTorch has no
ZeRO-2 that keeps the gathered parameters between steps; this is its nearest (gathered from forward
to the end of backward, then freed: its parameter bytes at the end of a step are the shards'). Run under torchrun; rank 0 prints one JSON line with the largest value over
the ranks: this rank's bytes of parameters (FSDP2: the local shards), gradients and AdamW state,
the largest RSS sampled after each forward, backward and step less the RSS before the model, the
peak RSS growth and the step time.

  torchrun --standalone --nproc_per_node=N fsdp2_memory.py --mode ddp|zero1|zero2|full [--width 768]
           [--blocks 8] [--batch 16] [--steps 6]
"""
import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, width, count):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(count))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def local_bytes(t):
    if t is None:
        return 0
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def optimizer_bytes(opt):
    if isinstance(opt, ZeroRedundancyOptimizer):
        opt = opt.optim
    return sum(local_bytes(v) for state in opt.state.values() for k, v in state.items()
               if torch.is_tensor(v) and k != "step")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "zero1", "zero2", "full"], required=True)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    peak_before, start = rss_peak(), rss_now()
    model = Stack(a.width, a.blocks)
    parameters = sum(p.numel() for p in model.parameters())
    if a.mode in ("full", "zero2"):
        mesh = init_device_mesh("cpu", (world,))
        keep = {"reshard_after_forward": False} if a.mode == "zero2" else {}
        for b in model.blocks:
            fully_shard(b, mesh=mesh, **keep)
        fully_shard(model, mesh=mesh, **keep)
        run = model
    else:
        run = DDP(model)
    if a.mode == "zero1":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4, weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    training, seconds = 0, 0.0
    for s in range(a.steps):
        torch.manual_seed(100 + rank * 1000 + s)
        x = torch.randn(a.batch, a.width)
        t0 = time.perf_counter()
        opt.zero_grad()
        y = run(x)
        training = max(training, rss_now())
        y.pow(2).mean().backward()
        training = max(training, rss_now())
        opt.step()
        training = max(training, rss_now())
        if s > 0:
            seconds += time.perf_counter() - t0
    params = list(model.parameters())
    m = torch.tensor([sum(local_bytes(p) for p in params), sum(local_bytes(p.grad) for p in params),
                      optimizer_bytes(opt), training - start, rss_peak() - peak_before, seconds / (a.steps - 1)],
                     dtype=torch.float64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    if rank == 0:
        mb = 1024.0 * 1024.0
        print(json.dumps({"side": "pytorch", "mode": a.mode, "world": world, "parameters": parameters,
                          "param_mb": round(m[0].item() / mb, 1), "grad_mb": round(m[1].item() / mb, 1),
                          "optim_mb": round(m[2].item() / mb, 1), "train_rss_mb": round(m[3].item() / mb, 1),
                          "peak_rss_growth_mb": round(m[4].item() / mb, 1), "step_s": round(m[5].item(), 4)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
