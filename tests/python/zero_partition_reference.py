#!/usr/bin/env python3
"""The reference for tests/libddp/zero_test.cc: which rank owns each parameter in PyTorch's
ZeroRedundancyOptimizer (its own _partition_parameters, run on the pinned wheel without a process
group). Usage: zero_partition_reference.py WORLD SHAPE... (a shape as 64x20); prints the owners as
JSON, one per parameter in the order given."""
import json
import sys

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer as Zero


class Partitioner:
    """The attributes _partition_parameters reads, with ZeroRedundancyOptimizer's own methods."""

    def __init__(self, world, params):
        self.world_size = world
        self.param_groups = [{"params": params}]
        self._partition_parameters_cache = []
        self._get_min_index = Zero._get_min_index.__get__(self)
        self._partition_param_group = Zero._partition_param_group.__get__(self)


def main():
    world = int(sys.argv[1])
    params = [torch.empty([int(d) for d in s.split("x")]) for s in sys.argv[2:]]
    shards = Zero._partition_parameters(Partitioner(world, params))
    owner = {}
    for rank, groups in enumerate(shards):
        for group in groups:
            for p in group["params"]:
                owner[id(p)] = rank
    print(json.dumps([owner[id(p)] for p in params]))


if __name__ == "__main__":
    main()
