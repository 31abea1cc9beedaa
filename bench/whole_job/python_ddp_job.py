#!/usr/bin/env python3
"""README command 1 done the way a Python PyTorch user does it, for bench/whole_job/run.sh:
torchrun --nproc_per_node=4 python_ddp_job.py ROOT trains the Fashion-MNIST CNN of
configs/fmnist_cnn_ddp.yaml (same layers as worker/models/models.cc, same normalisation, per-rank batch 32,
SGD lr 0.05 momentum 0.9, one epoch, DistributedSampler seed 0 with set_epoch) under
DistributedDataParallel over Gloo, then evaluates the whole test set sharded over the ranks in
batches of 100 and all-reduces the counts, as our worker does. Rank 0 exports the plain state_dict.
Rank 0 prints one JSON line: steps, test accuracy, train and eval seconds.

bench/precision/run.sh varies it through the environment: PY_JOB_MODEL (cnn | mlp: 784-512-256-10),
PY_JOB_PRECISION (fp32 | bf16 | fp16: the forward and loss under torch.autocast("cpu", dtype), fp16
with torch.amp.GradScaler("cpu")), PY_JOB_BATCH (per rank, default 32), PY_JOB_MAX_STEPS (0: the epoch).

bench/hooks/run.sh adds PY_JOB_HOOK (none | fp16 | bf16 | powersgd; default none: no hook), registered
with model.register_comm_hook as PyTorch documents it (default_hooks.fp16_compress_hook /
bf16_compress_hook with state None; powerSGD_hook.powerSGD_hook with PowerSGDState(process_group=None,
matrix_approximation_rank=PY_JOB_PSGD_RANK (default 1), start_powerSGD_iter=PY_JOB_PSGD_START
(default 1000))). With powersgd the JSON line also has gradient_elements and gradient_elements_sent
(PowerSGDState.compression_stats() totals, per rank), and DDP gets bucket_cap_mb=25, so these small
models sit in one bucket: with DDP's default 1 MB first bucket (two buckets) powerSGD_hook dies on Gloo
once it starts compressing ("Received data size doesn't match expected size"), apparently because it
issues its P and Q all-reduces from future callbacks, whose order across buckets differs between ranks.

bench/zero/run.sh adds PY_JOB_HIDDEN (the mlp's hidden widths, comma-separated; default 512,256, as our
model.hidden), PY_JOB_OPTIMIZER (sgd | adamw; default sgd: the SGD above; adamw: torch.optim.AdamW with
lr 0.05, betas (0.9, 0.999), eps 1e-8 and weight_decay 0, our worker's train.* defaults) and PY_JOB_ZERO
(1: the optimizer wrapped as PyTorch documents it, ZeroRedundancyOptimizer(model.parameters(),
optimizer_class=..., lr=..., ...): each rank keeps the state of its shard only; default 0: unwrapped).
Every run's JSON line also has, per rank (gathered to rank 0, in rank order): peak_rss_mb_per_process
(resource.getrusage(RUSAGE_SELF).ru_maxrss / 1024, at the end of the job) and
optimizer_state_bytes_per_process (the nbytes of every tensor in the optimizer's state: optimizer.state,
or for ZeRO zero.optim.state, the local optimizer's; AdamW's includes its 4-byte "step" tensors), plus
parameters and zero.
"""
import gzip
import json
import os
import resource
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MEAN, STD = 0.2860, 0.3530  # worker/data/fashion_mnist.h


class Cnn(nn.Module):  # worker/models/models.cc "cnn"
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


class Mlp(nn.Module):  # worker/models/models.cc "mlp": fc1..fcN, ReLU between, model.hidden [512, 256] by default
    def __init__(self, classes=10, hidden=(512, 256)):
        super().__init__()
        widths = [784, *hidden, classes]
        self.layers = len(widths) - 1
        for i in range(self.layers):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x):
        x = x.flatten(1)
        for i in range(self.layers):
            x = getattr(self, f"fc{i + 1}")(x)
            if i + 1 < self.layers:
                x = F.relu(x)
        return x


def state_bytes(optimizer):
    """The nbytes of every tensor in `optimizer`'s per-parameter state."""
    return sum(v.nbytes for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = struct.unpack(">I", data[:4])[0] & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(root, prefix):
    images = torch.from_numpy(read_idx(f"{root}/{prefix}-images-idx3-ubyte.gz").copy()).float()
    images = ((images / 255.0 - MEAN) / STD).unsqueeze(1)  # ToTensor + Normalize
    labels = torch.from_numpy(read_idx(f"{root}/{prefix}-labels-idx1-ubyte.gz").astype(np.int64))
    return TensorDataset(images, labels)


def main():
    root = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train, test = load(root, "train"), load(root, "t10k")
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=int(os.environ.get("PY_JOB_BATCH", "32")), sampler=sampler)
    hook = os.environ.get("PY_JOB_HOOK", "none")
    hidden = [int(w) for w in os.environ.get("PY_JOB_HIDDEN", "512,256").split(",")]
    net = Mlp(hidden=hidden) if os.environ.get("PY_JOB_MODEL", "cnn") == "mlp" else Cnn()
    model = DDP(net, bucket_cap_mb=25) if hook == "powersgd" else DDP(net)  # one bucket: see above
    psgd_state = None
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        psgd_state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(os.environ.get("PY_JOB_PSGD_RANK", "1")),
            start_powerSGD_iter=int(os.environ.get("PY_JOB_PSGD_START", "1000")))
        model.register_comm_hook(psgd_state, powerSGD_hook.powerSGD_hook)
    elif hook != "none":
        sys.exit(f"PY_JOB_HOOK is '{hook}'; use none, fp16, bf16 or powersgd")
    name, zero = os.environ.get("PY_JOB_OPTIMIZER", "sgd"), os.environ.get("PY_JOB_ZERO", "0") == "1"
    if name == "sgd":
        optimizer_class, options = torch.optim.SGD, dict(lr=0.05, momentum=0.9)
    elif name == "adamw":
        optimizer_class, options = torch.optim.AdamW, dict(lr=0.05, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    else:
        sys.exit(f"PY_JOB_OPTIMIZER is '{name}'; use sgd or adamw")
    if zero:
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class, **options)
    else:
        optimizer = optimizer_class(model.parameters(), **options)
    precision = os.environ.get("PY_JOB_PRECISION", "fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    max_steps = int(os.environ.get("PY_JOB_MAX_STEPS", "0"))

    start = time.perf_counter()
    steps = 0
    for epoch in range(1):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            steps += 1
            if steps == max_steps:
                break
    train_s = time.perf_counter() - start

    start = time.perf_counter()
    model.eval()
    n = len(test)
    begin, end = n * rank // world, n * (rank + 1) // world
    correct = 0
    with torch.no_grad():
        for i in range(begin, end, 100):
            if dtype is not None:  # evaluated in the precision it was trained in, as our worker does
                with torch.autocast("cpu", dtype=dtype):
                    correct += int((model(test.tensors[0][i:min(i + 100, end)]).argmax(1) ==
                                    test.tensors[1][i:min(i + 100, end)]).sum())
                continue
            x, y = test.tensors[0][i:min(i + 100, end)], test.tensors[1][i:min(i + 100, end)]
            correct += int((model(x).argmax(1) == y).sum())
    counts = torch.tensor([correct, end - begin])
    dist.all_reduce(counts)
    eval_s = time.perf_counter() - start
    mine = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                         state_bytes(optimizer.optim if zero else optimizer)], dtype=torch.float64)
    ranks = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(ranks, mine)
    if rank == 0:
        out = os.environ.get("PY_JOB_OUT", "out/python_ddp_job")
        os.makedirs(out, exist_ok=True)
        torch.save(model.module.state_dict(), f"{out}/model.pt")
        line = {"steps": steps, "test_accuracy": counts[0].item() / counts[1].item(),
                "train_seconds": train_s, "eval_seconds": eval_s,
                "parameters": sum(p.numel() for p in net.parameters()), "zero": zero,
                "peak_rss_mb_per_process": [r[0].item() for r in ranks],
                "optimizer_state_bytes_per_process": [int(r[1].item()) for r in ranks]}
        if psgd_state is not None:
            _, before, after = psgd_state.compression_stats()
            line.update(gradient_elements=int(before), gradient_elements_sent=int(after))
        print(json.dumps(line), flush=True)
    dist.destroy_process_group()
    # Skip the interpreter's teardown: the pinned wheel's Gloo group aborts there now and then
    # ("terminate called without an active exception") after every result is printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
