#!/usr/bin/env python3
"""Python DDP doing what tests/e2e/python_recipe_test.cc asks our worker to do, as a PyTorch user
writes it: 2 ranks (gloo over loopback, torch.multiprocessing), DistributedSampler with set_epoch,
DataLoader, DistributedDataParallel, AdamW, a LinearLR warm-up chained to CosineAnnealingLR by
SequentialLR, clip_grad_norm_ after backward, for a fixed number of optimizer steps.

usage: ddp_recipe_reference.py OUT_DIR STEPS
Writes OUT_DIR/train.pt and OUT_DIR/test.pt ({"x", "y"}: the data both sides train on),
OUT_DIR/init.pt (the initial weights both sides start from) and OUT_DIR/python_params.pt (rank 0's
parameters after STEPS steps); prints one JSON line with the settings it used.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from reference_common import Mlp, end_rank, free_port, write_recipe_inputs

# The recipe; the C++ test passes the same values to the worker as train.* keys.
SETTINGS = {"world": 2, "seed": 7, "batch_size": 8, "lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-8,
            "weight_decay": 0.05, "warmup_steps": 5, "min_lr": 0.0005, "clip_grad_norm": 0.5,
            "hidden": 32, "train_size": 96, "test_size": 32, "classes": 3}


def rank_main(rank, out, steps, port):
    s = SETTINGS
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=s["world"])
    data = torch.load(os.path.join(out, "train.pt"))
    dataset = TensorDataset(data["x"], data["y"])
    model = Mlp(16, s["hidden"], s["classes"])
    model.load_state_dict(torch.load(os.path.join(out, "init.pt")))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=s["lr"], betas=tuple(s["betas"]), eps=s["eps"],
                            weight_decay=s["weight_decay"])
    w = s["warmup_steps"]
    sched = SequentialLR(opt, [LinearLR(opt, start_factor=1.0 / (w + 1), end_factor=1.0, total_iters=w),
                               CosineAnnealingLR(opt, T_max=steps - w, eta_min=s["min_lr"])], milestones=[w])
    sampler = DistributedSampler(dataset, num_replicas=s["world"], rank=rank, shuffle=True, seed=s["seed"])
    loader = DataLoader(dataset, batch_size=s["batch_size"], sampler=sampler)
    done, epoch = 0, 0
    while done < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), s["clip_grad_norm"])
            opt.step()
            sched.step()
            done += 1
            if done == steps:
                break
        epoch += 1
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out, "python_params.pt"))
    end_rank()


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    s = SETTINGS
    write_recipe_inputs(out, s, data_seed=123)
    port = free_port()
    mp.spawn(rank_main, args=(out, steps, port), nprocs=s["world"], join=True)
    print(json.dumps(dict(s, steps=steps)))


if __name__ == "__main__":
    main()
