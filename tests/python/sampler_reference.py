#!/usr/bin/python3
"""Reference index lists from PyTorch's own DistributedSampler, printed as JSON.

Run with the reference PyTorch in .venv (DDP_PYTHON). The C++ test
tests/sampler/sampler_reference_test.cc compares ddp::sampler::DistributedSampler
against every case printed here.

Output: {"torch_version": str, "cases": [{"n", "world", "seed", "epoch", "shuffle",
"drop_last", "num_samples", "total_size", "ranks": [[indices of rank 0], ...]}]}
"""
import itertools
import json
import sys

import torch
from torch.utils.data.distributed import DistributedSampler

SIZES = [0, 1, 3, 7, 10, 17, 100, 1001]
WORLDS = [1, 2, 3, 4, 8]
# 2**40 + 7 checks that seeds wider than 32 bits reach the generator intact.
SEEDS = [0, 42, 2**40 + 7]
EPOCHS = [0, 1, 5]


class _Sized:
    """DistributedSampler only calls len() on the dataset."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def case(n, world, seed, epoch, shuffle, drop_last):
    ranks = []
    for rank in range(world):
        s = DistributedSampler(_Sized(n), num_replicas=world, rank=rank,
                               shuffle=shuffle, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        ranks.append(list(iter(s)))
    return {"n": n, "world": world, "seed": seed, "epoch": epoch,
            "shuffle": shuffle, "drop_last": drop_last,
            "num_samples": s.num_samples, "total_size": s.total_size,
            "ranks": ranks}


def main():
    cases = [case(*args) for args in itertools.product(
        SIZES, WORLDS, SEEDS, EPOCHS, [True, False], [False, True])]
    json.dump({"torch_version": torch.__version__, "cases": cases},
              sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
