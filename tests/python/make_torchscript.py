"""Scripts models the way a PyTorch user does, for model.name: torchscript.

    python make_torchscript.py DIR

DIR/cnn_bn.pt: torch.jit.script(Cnn(batch_norm=True)) — the Python twin of our CNN from
check_export.py, so check_export.py can load the trained export into it with strict=True.
DIR/no_params.pt: a module without parameters. DIR/seven.pt: logits for 7 classes, not 10.
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_export import Cnn  # noqa: E402


class NoParams(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :10]


class Seven(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 7)

    def forward(self, x):
        return self.fc(x.flatten(1))


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.jit.script(Cnn(batch_norm=True)).save(os.path.join(out, "cnn_bn.pt"))
    torch.jit.script(NoParams()).save(os.path.join(out, "no_params.pt"))
    torch.jit.script(Seven()).save(os.path.join(out, "seven.pt"))


if __name__ == "__main__":
    main()
