#!/usr/bin/env python3
"""Writes torch.save files the way users produce them, plus a JSON manifest of
what each holds (key, dtype, shape, and the values as float lists), for the C++
reader tests. Run it with the reference interpreter (the tests' DDP_PYTHON,
.venv/bin/python, PyTorch 2.x). usage: make_torch_files.py OUT_DIR"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn


def describe(state):
    return {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape),
                "values": v.detach().double().flatten().tolist()} for k, v in state.items()}


def main():
    out = sys.argv[1]
    assert int(torch.__version__.split(".")[0]) >= 2, f"the reference is PyTorch 2.x, got {torch.__version__}"
    torch.manual_seed(0)
    manifest = {}

    # A plain model's state_dict, BatchNorm buffers (num_batches_tracked: int64) included.
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    net(torch.randn(5, 3))  # moves running stats off their initial values
    torch.save(net.state_dict(), os.path.join(out, "plain_state_dict.pt"))
    manifest["plain_state_dict.pt"] = describe(net.state_dict())

    # nn.DataParallel-wrapped model: every key starts with "module.".
    dp = nn.DataParallel(net)
    torch.save(dp.state_dict(), os.path.join(out, "dp_state_dict.pt"))
    manifest["dp_state_dict.pt"] = describe(dp.state_dict())

    # DistributedDataParallel (a world-1 gloo group): "module."-prefixed too.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(net)
        torch.save(ddp.state_dict(), os.path.join(out, "ddp_state_dict.pt"))
        manifest["ddp_state_dict.pt"] = describe(ddp.state_dict())
    finally:
        dist.destroy_process_group()

    # A training checkpoint dict with nested state_dict and scalars.
    torch.save({"model": net.state_dict(), "epoch": 3, "lr": 0.125, "name": "run-1",
                "steps": [1, 2, 3]}, os.path.join(out, "checkpoint.pt"))
    manifest["checkpoint.pt"] = {"model": describe(net.state_dict()), "epoch": 3, "lr": 0.125}

    # Dtypes, a view sharing storage, a non-contiguous tensor, an empty one.
    base = torch.arange(12, dtype=torch.float32)
    mixed = {"half": torch.tensor([1.5, -2.25], dtype=torch.float16),
             "bf16": torch.tensor([3.0, 0.5], dtype=torch.bfloat16),
             "long": torch.tensor([1, -7, 2 ** 40], dtype=torch.int64),
             "int": torch.tensor([5, -6], dtype=torch.int32),
             "bool": torch.tensor([True, False, True]),
             "u8": torch.tensor([0, 255], dtype=torch.uint8),
             "double": torch.tensor([[1.0, 2.0]], dtype=torch.float64),
             "base": base, "view": base[2:8].view(2, 3), "transposed": base.view(3, 4).t(),
             "empty": torch.zeros(0, 3)}
    torch.save(mixed, os.path.join(out, "mixed.pt"))
    manifest["mixed.pt"] = describe(mixed)

    # The twin of our Mlp (784-16-10) trained a little, wrapped in DataParallel and
    # saved as if on a GPU (location "cuda:0"): what a user brings from a GPU box.
    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(784, 16)
            self.fc2 = nn.Linear(16, 10)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x.flatten(1))))

    mlp = Mlp()
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(mlp(x), y).backward()
        opt.step()
    wrapped = nn.DataParallel(mlp)
    real_tag = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(wrapped.state_dict(), os.path.join(out, "gpu_dp_mlp.pt"))
    finally:
        torch.serialization.location_tag = real_tag
    manifest["gpu_dp_mlp.pt"] = describe(wrapped.state_dict())

    # The legacy (pre-1.6) serialization: must be refused with a clear message.
    torch.save({"w": torch.ones(2)}, os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
