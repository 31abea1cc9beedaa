#!/usr/bin/env python3
"""The reference side of bench/images' training rows: torchvision's resnet18 under DDP (run it with
torchrun), fed by torchvision.datasets.ImageFolder + DataLoader(num_workers=N, DistributedSampler)
with the ImageNet training transform at SIZE, SGD (lr 0.1, momentum 0.9, weight decay 1e-4), fp32
on the CPU over Gloo. Rank 0 prints one JSON line: images/s over all ranks after the warm-up steps.

  torchrun --standalone --nproc_per_node=2 torchvision_train.py ROOT --workers N [--batch 32]
           [--size 112] [--steps 30] [--warmup 5]
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, models

from torchvision_loader import pil_train_transform  # the same transform as the loader bench


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train = pil_train_transform(a.size)
    data = datasets.ImageFolder(a.root, transform=train)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=a.batch, sampler=sampler, num_workers=a.workers, drop_last=True,
                        persistent_workers=a.workers > 0)
    model = DDP(models.resnet18(num_classes=len(data.classes)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    model.train()
    images = 0
    for step, (x, y) in enumerate(loader):
        if step == a.warmup:
            t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= a.warmup:
            images += x.shape[0] * world
        if step + 1 == a.warmup + a.steps:
            break
    seconds = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"side": "torchvision", "workers": a.workers, "world": world, "images_per_s": images / seconds}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
