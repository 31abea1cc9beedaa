"""What the multi-process Python references share: starting Gloo ranks, ending them, and the small
MLP recipe data that tests/e2e/recipe_test.cc trains on both sides.

Imported by the references beside it (they run as scripts, so this folder is on sys.path, also in
the processes torch.multiprocessing spawns).
"""
import json
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def free_port():
    """A loopback port the kernel just chose and released, for a tcp:// rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def end_rank(exit_code=0):
    """Ends a spawned rank once its results are written: every rank reaches the barrier, the group
    is destroyed, and the interpreter's teardown is skipped."""
    dist.barrier()
    dist.destroy_process_group()
    # Skip the interpreter's teardown: the pinned wheel's Gloo group aborts there now and then
    # ("terminate called without an active exception", no Python frame; ~1 run in 10 after Join),
    # which would fail the test for nothing of ours (seen in CI on ddp_script.py, stop 36).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _rank(rank, world, tmp, compute, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "init"), rank=rank, world_size=world)
    result = compute(rank, *args)
    with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    end_rank()


def run_ranks(world, compute, *args):
    """Runs compute(rank, *args) on `world` spawned processes, each one thread in one Gloo group
    (file:// rendezvous), and returns their JSON results in rank order."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(world, tmp, compute, args), nprocs=world, join=True)
        results = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                results.append(json.load(f))
    return results


class Mlp(nn.Module):
    """The worker's model.name mlp with model.hidden [32]: flatten, fc1, relu, fc2."""

    def __init__(self, inputs, hidden, classes):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def write_recipe_inputs(out, settings, data_seed):
    """Writes out/train.pt and out/test.pt ({"x", "y"}: 1x4x4 inputs drawn from data_seed) and
    out/init.pt (an Mlp's initial weights after torch.manual_seed(0)), what both sides start from."""
    g = torch.Generator().manual_seed(data_seed)
    for name, n in (("train.pt", settings["train_size"]), ("test.pt", settings["test_size"])):
        x = torch.randn(n, 1, 4, 4, generator=g)
        y = torch.randint(0, settings["classes"], (n,), generator=g)
        torch.save({"x": x, "y": y}, os.path.join(out, name))
    torch.manual_seed(0)
    torch.save(Mlp(16, settings["hidden"], settings["classes"]).state_dict(), os.path.join(out, "init.pt"))
