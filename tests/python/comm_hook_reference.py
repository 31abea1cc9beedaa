#!/usr/bin/env python3
"""The reference for tests/libddp/comm_hook_test.cc: PyTorch's own DDP communication hooks
(torch.distributed.algorithms.ddp_comm_hooks, the pinned wheel) run by 2 real processes over Gloo.

Reads one JSON object on stdin: {"world": 2, "cases": [{"name", "hook": "allreduce" | "fp16" | "bf16" |
"powersgd", "iterations", "buckets": [[shape, ...], ...], "powersgd": {PowerSGDState's arguments}}]}
and prints {name: [[bucket buffers after the hook, per iteration and bucket] per rank]}.

Rank r's gradients for iteration t and bucket b are torch.randn(numel, generator=Generator().manual_seed(
1000 t + 10 r + b)): the C++ test draws the same numbers with LibTorch's CPU generator.
"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd

from reference_common import run_ranks


class Bucket:
    """What the hooks use of dist.GradBucket: buffer(), gradients(), index(), is_last()."""

    def __init__(self, index, is_last, buffer, shapes):
        self._index, self._is_last, self._buffer = index, is_last, buffer
        self._grads, offset = [], 0
        for shape in shapes:
            n = 1
            for d in shape:
                n *= d
            self._grads.append(buffer[offset:offset + n].view(shape))
            offset += n

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._grads

    def index(self):
        return self._index

    def is_last(self):
        return self._is_last


def numel(shapes):
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def run_case(case, rank):
    hook = case["hook"]
    state = None
    if hook == "powersgd":
        state = psgd.PowerSGDState(process_group=None, **case["powersgd"])
    out = []
    for t in range(case["iterations"]):
        for b, shapes in enumerate(case["buckets"]):
            g = torch.Generator().manual_seed(1000 * t + 10 * rank + b)
            buffer = torch.randn(numel(shapes), generator=g)
            bucket = Bucket(b, b + 1 == len(case["buckets"]), buffer, shapes)
            if hook == "allreduce":
                fut = default_hooks.allreduce_hook(None, bucket)
            elif hook == "fp16":
                fut = default_hooks.fp16_compress_hook(None, bucket)
            elif hook == "bf16":
                fut = default_hooks.bf16_compress_hook(None, bucket)
            else:
                fut = psgd.powerSGD_hook(state, bucket)
            result = fut.wait()
            out.append(result.tolist())
    return out


def rank_results(rank, request):
    return {case["name"]: run_case(case, rank) for case in request["cases"]}


def main():
    request = json.load(sys.stdin)
    world = request["world"]
    per_rank = run_ranks(world, rank_results, request)
    print(json.dumps({case["name"]: [per_rank[r][case["name"]] for r in range(world)] for case in request["cases"]}))


if __name__ == "__main__":
    main()
