#!/usr/bin/env python3
"""The PyTorch side of fsdp_step_breakdown.cc: where an FSDP2 `fully_shard` step's wall time goes
on fsdp_memory_bench's model (CPU, Gloo). The step split into forward, backward and the optimizer's
step (mean over the steps after the first), then one block's parts at the step's sizes, each the
mean of --reps calls after a barrier: unshard() + reshard() (FSDP2's all-gather, copy-out and
allocation), all_gather_into_tensor of the block's S elements, reduce_scatter_tensor of world x S
(FSDP2's reduce-scatter; SUM then a division, as FSDP2 on Gloo), all_reduce of world x S, the copy-in
(a fresh (world, S) buffer filled from a full gradient), a fresh buffer's allocation and first
touch, and the block's forward + backward unsharded. Rank 0 prints one JSON line (seconds, the
largest over the ranks).

  torchrun --standalone --nproc_per_node=2 fsdp2_step_breakdown.py [--width 768] [--blocks 8]
           [--batch 16] [--steps 6] [--reps 20]
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fsdp2_memory import Block, Stack


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Stack(a.width, a.blocks)
    mesh = init_device_mesh("cpu", (world,))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)

    fwd = bwd = step = 0.0
    for s in range(a.steps):
        torch.manual_seed(100 + rank * 1000 + s)
        x = torch.randn(a.batch, a.width)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        y = model(x)
        t1 = time.perf_counter()
        y.pow(2).mean().backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if s > 0:
            fwd, bwd, step = fwd + t1 - t0, bwd + t2 - t1, step + t3 - t2
    timed = a.steps - 1

    unit = model.blocks[0]
    S = sum(-(-p.shape[0] // world) * (p.numel() // p.shape[0]) for p in Block(a.width).parameters())

    def mean(fn):
        fn()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.reps):
            fn()
        return (time.perf_counter() - t0) / a.reps

    with torch.no_grad():
        shard, full_grad = torch.randn(S), torch.randn(world * S)
        block = torch.randn(world * S)

        def unshard():
            unit.unshard()
            unit.reshard()

        def all_gather():
            dist.all_gather_into_tensor(torch.empty(world * S), shard)

        def reduce_scatter():
            out = torch.empty(S)
            dist.reduce_scatter_tensor(out, full_grad.clone(), op=dist.ReduceOp.SUM)
            out.div_(world)

        r = dict(unshard_reshard=mean(unshard), all_gather=mean(all_gather), reduce_scatter=mean(reduce_scatter),
                 all_reduce_world_x_S=mean(lambda: dist.all_reduce(block)),
                 copy_in=mean(lambda: torch.empty(world, S).view(-1).copy_(full_grad)),
                 alloc_first_touch=mean(lambda: torch.empty(world * S).fill_(1.0)),
                 fill_reused=mean(lambda: block.fill_(1.0)))
    plain = Block(a.width)

    def compute():
        x = torch.randn(a.batch, a.width, requires_grad=True)
        plain(x).pow(2).mean().backward()

    r["block_fwd_bwd"] = mean(compute)
    r = dict(forward=fwd / timed, backward=bwd / timed, optimizer=step / timed, **r)
    m = torch.tensor(list(r.values()), dtype=torch.float64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    if rank == 0:
        out = {"side": "pytorch", "world": world, "shard_numel": S}
        out.update({k: round(v, 5) for k, v in zip(r, m.tolist())})
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()
    os._exit(0)  # the pinned wheel's Gloo can abort in the interpreter's teardown


if __name__ == "__main__":
    main()
