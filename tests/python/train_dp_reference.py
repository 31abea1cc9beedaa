#!/usr/bin/python3
"""Trains the Python twin of our MLP briefly on Fashion-MNIST, plain or inside
nn.DataParallel or DistributedDataParallel (a world-1 gloo group), saves
model.state_dict() (plain keys, or "module."-prefixed for the wrappers) as a GPU
box would (storage location cuda:0), and prints Python's test accuracy.

usage: train_dp_reference.py OUT.pt HIDDEN(comma list) FASHION_MNIST_ROOT [plain|dp|ddp]
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from check_export import MEAN, STD, Mlp, read_idx  # noqa: E402


def load(root, prefix):
    x = torch.from_numpy(read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz")).copy())
    y = torch.from_numpy(read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz")).astype("int64"))
    return x.float().div(255).sub(MEAN).div(STD).unsqueeze(1), y


def main():
    out, hidden, root = sys.argv[1], [int(h) for h in sys.argv[2].split(",")], sys.argv[3]
    torch.manual_seed(0)
    x, y = load(root, "train")
    wrapper = sys.argv[4] if len(sys.argv) > 4 else "dp"
    model = Mlp(hidden)
    if wrapper == "dp":
        model = nn.DataParallel(model)
    elif wrapper == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        model = nn.parallel.DistributedDataParallel(model)
    else:
        assert wrapper == "plain", wrapper
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(100):
        idx = torch.randint(0, len(y), (64,))
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    real_tag = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(model.state_dict(), out)
    finally:
        torch.serialization.location_tag = real_tag
    tx, ty = load(root, "t10k")
    model.eval()
    with torch.no_grad():
        correct = sum((model(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum().item()
                      for i in range(0, len(ty), 1000))
    keys = list(model.state_dict())
    print(json.dumps({"correct": correct, "total": len(ty), "accuracy": correct / len(ty), "first_key": keys[0]}))


if __name__ == "__main__":
    main()
