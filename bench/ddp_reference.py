#!/usr/bin/python3
"""The Python side of bench/run_ddp_bench.sh: PyTorch's own DistributedDataParallel
(gloo) on the same model, synthetic in-memory data, per-rank batch and steps as
our worker. Started by our ddp-launch, which sets torchrun's env contract.
DDP_BENCH_DEVICE=cuda: NCCL, each rank on cuda:LOCAL_RANK, batches copied from
host memory per step like our worker does (bench/gpu/run_gpu_bench.sh).

usage: ddp_reference.py {mlp|cnn} HIDDEN(csv) BATCH WARMUP TIMED
Rank 0 prints one JSON line: samples_per_s over the TIMED steps after WARMUP.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler


class Mlp(nn.Module):
    def __init__(self, hidden, inputs=784, classes=10):
        super().__init__()
        widths = [inputs] + hidden + [classes]
        self.layers = nn.ModuleList(nn.Linear(widths[i], widths[i + 1]) for i in range(len(widths) - 1))

    def forward(self, x):
        x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


class Cnn(nn.Module):  # worker/models/models.cc
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    name, hidden, batch, warmup, timed = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cuda = os.environ.get("DDP_BENCH_DEVICE", "cpu") == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = (Mlp([int(h) for h in hidden.split(",")]) if name == "mlp" else Cnn()).to(device)
    # bucket_cap_mb=25, broadcast_buffers=True: the defaults we mirror
    model = DDP(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # Same data style as our worker: an in-memory tensor, sampler indices, a gather per batch.
    n = 8192
    images = torch.randn(n, 1, 28, 28)
    labels = torch.randint(0, 10, (n,))
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0)
    indices = []
    epoch = 0
    step = 0
    start = None
    while step < warmup + timed:
        if not indices:
            sampler.set_epoch(epoch)
            epoch += 1
            indices = list(sampler)
        idx = torch.tensor(indices[:batch])
        indices = indices[batch:]
        x, y = images.index_select(0, idx).to(device), labels.index_select(0, idx).to(device)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        step += 1
        if step == warmup:
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
    dist.barrier()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"samples_per_s": timed * batch * world / seconds, "seconds": seconds}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
