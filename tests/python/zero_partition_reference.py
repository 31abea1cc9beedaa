#!/usr/bin/env python3
"""The reference for tests/libddp/zero_test.cc: which rank owns each parameter in PyTorch's
ZeroRedundancyOptimizer (its own _partition_parameters, run on the pinned wheel without a process
group). Usage: zero_partition_reference.py WORLD SHAPE... (a shape as 64x20; "|" starts another
parameter group); prints the owners as JSON, one per parameter in the order given."""
import json
import sys

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer as Zero


class Partitioner:
    """The attributes _partition_parameters reads, with ZeroRedundancyOptimizer's own methods."""

    def __init__(self, world, groups):
        self.world_size = world
        self.param_groups = [{"params": params} for params in groups]
        self._partition_parameters_cache = []
        self._get_min_index = Zero._get_min_index.__get__(self)
        self._partition_param_group = Zero._partition_param_group.__get__(self)


def main():
    world = int(sys.argv[1])
    groups = [[]]
    for arg in sys.argv[2:]:
        if arg == "|":
            groups.append([])
        else:
            groups[-1].append(torch.empty([int(d) for d in arg.split("x")]))
    params = [p for g in groups for p in g]
    shards = Zero._partition_parameters(Partitioner(world, groups))
    owner = {}
    for rank, rank_groups in enumerate(shards):
        for group in rank_groups:
            for p in group["params"]:
                owner[id(p)] = rank
    print(json.dumps([owner[id(p)] for p in params]))


if __name__ == "__main__":
    main()
