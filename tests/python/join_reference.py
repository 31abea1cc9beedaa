#!/usr/bin/env python3
"""The reference for tests/libddp/join_test.cc: PyTorch's own Join context manager
(torch.distributed.algorithms.Join) around DistributedDataParallel, 3 real processes over Gloo, ranks
with 7, 10 and 13 batches.

Usage: join_reference.py. Runs three cases, "divide1_buffers1", "divide0_buffers1" and
"divide1_buffers0" (divide_by_initial_world_size, broadcast_buffers), and prints {case: {"ranks":
[{name: flat values} per rank], "steps": [optimizer steps per rank]}}: every rank's parameters and
buffers after the Join (they are equal: the last rank to join broadcasts its model).

The model, its initial values and the data are given by formulas the C++ test repeats: Linear(6, 8),
ReLU, BatchNorm1d(8), Linear(8, 3); parameter or buffer k (in named_parameters() then named_buffers()
order, floating ones) starts as 0.3 * randn(shape, generator=Generator().manual_seed(k)) (running_var
as 1 + that squared); rank r's batch b is randn(5, 6, generator=Generator().manual_seed(100 r + b)); the
loss is the output's squared mean; SGD lr 0.1, momentum 0.9.
"""
import json
import warnings

import torch
import torch.distributed as dist
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from reference_common import run_ranks

BATCHES = [7, 10, 13]


def make_model():
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    with torch.no_grad():
        k = 0
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point():
                continue
            values = 0.3 * torch.randn(t.shape, generator=torch.Generator().manual_seed(k))
            t.copy_(1 + values * values if name.endswith("running_var") else values)
            k += 1
    return model


CASES = {"divide1_buffers1": (True, True), "divide0_buffers1": (False, True), "divide1_buffers0": (True, False)}


def run_case(rank, divide, broadcast_buffers):
    warnings.filterwarnings("ignore", category=FutureWarning)  # broadcast_buffers' rename in new wheels
    model = DDP(make_model(), **({} if broadcast_buffers else {"broadcast_buffers": False}))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = 0
    with Join([model], divide_by_initial_world_size=divide):
        for b in range(BATCHES[rank]):
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(100 * rank + b))
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            steps += 1
    state = {n: t.detach().double().flatten().tolist() for n, t in model.module.state_dict().items()
             if t.is_floating_point()}
    return {"state": state, "steps": steps}


def rank_results(rank):
    return {name: run_case(rank, *flags) for name, flags in CASES.items()}


def main():
    out = run_ranks(len(BATCHES), rank_results)
    print(json.dumps({name: {"ranks": [o[name]["state"] for o in out], "steps": [o[name]["steps"] for o in out]}
                      for name in CASES}))


if __name__ == "__main__":
    main()
