"""A user's Python DDP script, started by our ddp-launch (env:// init; with
--legacy it also needs torch.distributed.launch's --local_rank argument).

Trains a seeded Linear(4, 3) for 3 SGD steps with DistributedDataParallel
(gloo, CPU), each rank on its own batch, then checks (1) every rank ends with
the same parameters and (2) they equal a single-process run on the two
batches concatenated (DDP's averaged gradient is the full-batch gradient).
Prints one JSON line per rank; exits 1 on a mismatch.
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)


def fresh_model():
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def train(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--legacy", action="store_true", help="require --local_rank like torch.distributed.launch")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args = parser.parse_args()
    if args.legacy and args.local_rank is None:
        sys.exit("--local_rank was not passed")
    local_rank = args.local_rank if args.local_rank is not None else int(os.environ["LOCAL_RANK"])
    assert local_rank == int(os.environ["LOCAL_RANK"]), (local_rank, os.environ["LOCAL_RANK"])

    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(fresh_model())
    mine = train(ddp, [batch(rank, s) for s in range(3)])

    flat = torch.cat([p.flatten() for p in mine])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    ranks_equal = all(torch.equal(everyone[0], t) for t in everyone)

    full = [(torch.cat([batch(r, s)[0] for r in range(world)]), torch.cat([batch(r, s)[1] for r in range(world)]))
            for s in range(3)]
    reference = torch.cat([p.flatten() for p in train(fresh_model(), full)])
    matches = torch.allclose(flat, reference, atol=1e-6)
    print(json.dumps({"rank": rank, "local_rank": local_rank, "world": world, "ranks_equal": ranks_equal,
                      "matches_single_process": matches, "legacy": args.legacy}), flush=True)
    # Every rank done before rank 0, which hosts the TCPStore, tears its group down: without it
    # Python torch 2.15 rank 0 was seen aborting at exit ("terminate called without an active
    # exception") once in many runs.
    dist.barrier()
    dist.destroy_process_group()
    # Every result is written. Skip the interpreter's teardown: the pinned wheel's Gloo group aborts
    # there now and then ("terminate called without an active exception", no Python frame), which
    # would fail the test for nothing of ours (seen in CI on ddp_script.py, stop 36).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ranks_equal and matches else 1)


if __name__ == "__main__":
    main()
