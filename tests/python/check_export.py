#!/usr/bin/env python3
"""Loads a ddp-launch export with plain PyTorch (torch.load(path) with its
default weights_only=True, PyTorch >= 2.6) and measures its test accuracy, or
prints the values the model holds after loading.

The modules below are the Python twins of worker/models/models.cc (same parameter
names); load_state_dict(strict=True) fails on any missing, extra or
"module."-prefixed key. Prints one JSON object. Run it with the reference
interpreter (the tests' DDP_PYTHON, .venv/bin/python).

usage: check_export.py MODEL.pt {mlp|cnn} HIDDEN(comma list) FASHION_MNIST_ROOT
       check_export.py MODEL.pt {mlp|cnn} HIDDEN(comma list) --values
"""
import collections
import gzip
import io
import json
import os
import pickle
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # worker/data/fashion_mnist.h


class Mlp(nn.Module):
    def __init__(self, hidden, inputs=784, classes=10):
        super().__init__()
        widths = [inputs] + hidden + [classes]
        for i in range(len(widths) - 1):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))
        self.n = len(widths) - 1

    def forward(self, x):
        x = x.flatten(1)
        for i in range(self.n):
            x = getattr(self, f"fc{i + 1}")(x)
            if i + 1 < self.n:
                x = F.relu(x)
        return x


class Cnn(nn.Module):
    def __init__(self, classes=10, batch_norm=False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32) if batch_norm else nn.Identity()
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64) if batch_norm else nn.Identity()
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class _Probe:
    """An arbitrary class: the weights_only unpickler must refuse it."""


def require_weights_only_default():
    """Asserts that a plain torch.load(path), the call users make, is the
    weights_only=True load: PyTorch >= 2.6, not overridden by the environment,
    and refusing a pickled object of an arbitrary class."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert (major, minor) >= (2, 6), f"the reference must default to weights_only=True, got torch {torch.__version__}"
    assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in ("", "0", "false"), \
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: torch.load would not default to weights_only=True"
    probe = io.BytesIO()
    torch.save(_Probe(), probe)
    probe.seek(0)
    try:
        torch.load(probe)  # no weights_only argument: the default
    except pickle.UnpicklingError:
        return
    raise AssertionError("plain torch.load accepted an arbitrary class: weights_only=True is not the default")


def describe(state):
    return {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape),
                "values": v.detach().double().flatten().tolist()} for k, v in state.items()}


def main():
    path, name, hidden, root = sys.argv[1:5]
    require_weights_only_default()
    state = torch.load(path, map_location="cpu")  # no weights_only argument: the default users get
    assert isinstance(state, collections.OrderedDict), f"a state_dict is an OrderedDict, got {type(state)}"
    model = (Mlp([int(h) for h in hidden.split(",")]) if name == "mlp"
             else Cnn(batch_norm="bn1.weight" in state))  # worker: model.batch_norm
    model.load_state_dict(state, strict=True)
    if root == "--values":
        # What the model holds after the strict load, in its own state_dict order.
        print(json.dumps({"type": type(state).__name__, "keys": list(state.keys()),
                          "state": describe(model.state_dict())}))
        return
    model.eval()
    images = read_idx(os.path.join(root, "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(root, "t10k-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.copy()).float().div(255).sub(MEAN).div(STD).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    print(json.dumps({"correct": correct, "total": len(y), "accuracy": correct / len(y),
                      "keys": sorted(state.keys())}))


if __name__ == "__main__":
    main()
