#!/usr/bin/env python3
"""PyTorch's Join doing what tests/e2e/recipe_test.cc asks our worker to do with
train.uneven_inputs: join, as a PyTorch user writes it: 3 ranks (gloo over loopback,
torch.multiprocessing), each with its unpadded share of the epoch's permutation (what
DistributedSampler gives before it pads: randperm(N, seed + epoch)[rank::3]), a DataLoader over it,
DistributedDataParallel inside `with Join([ddp]):` every epoch.

The shares are 33, 32 and 32 samples at batch 8: 5, 4 and 4 batches, so in each epoch's last step
ranks 1 and 2 have joined and rank 0 trains alone (its gradient divided by 3, the joined ranks
counting zeros). Two runs: "sgd" (SGD without momentum, a stateless optimizer, 3 epochs) and
"adamw" (AdamW, 1 epoch). PyTorch's joined ranks skip the optimizer step and get the last joiner's
parameters at the end of the Join; with a stateful optimizer their state then lags behind, so a
second epoch would no longer be comparable (our worker steps every rank alike instead).

usage: join_worker_reference.py OUT_DIR
Writes OUT_DIR/train.pt and OUT_DIR/test.pt ({"x", "y"}), OUT_DIR/init.pt (the initial weights),
OUT_DIR/python_<run>.pt (rank 0's parameters at the end of each run; every rank ends with them) and
prints one JSON line with the settings.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset

from reference_common import Mlp, end_rank, free_port, write_recipe_inputs

SETTINGS = {"world": 3, "seed": 11, "batch_size": 8, "hidden": 32, "train_size": 97, "test_size": 30,
            "classes": 3,
            "runs": {"sgd": {"optimizer": "sgd", "lr": 0.1, "epochs": 3},
                     "adamw": {"optimizer": "adamw", "lr": 0.01, "weight_decay": 0.05, "epochs": 1}}}


def train(rank, out, name, run):
    s = SETTINGS
    data = torch.load(os.path.join(out, "train.pt"))
    dataset = TensorDataset(data["x"], data["y"])
    model = Mlp(16, s["hidden"], s["classes"])
    model.load_state_dict(torch.load(os.path.join(out, "init.pt")))
    ddp = DDP(model)
    if run["optimizer"] == "adamw":
        opt = torch.optim.AdamW(ddp.parameters(), lr=run["lr"], weight_decay=run["weight_decay"])
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=run["lr"])
    steps = [0] * s["world"]
    for epoch in range(run["epochs"]):
        g = torch.Generator()
        g.manual_seed(s["seed"] + epoch)
        share = torch.randperm(len(dataset), generator=g)[rank::s["world"]].tolist()
        loader = DataLoader(Subset(dataset, share), batch_size=s["batch_size"], shuffle=False)
        with Join([ddp]):
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
                steps[rank] += 1
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out, f"python_{name}.pt"))
    counts = torch.tensor(steps)
    dist.all_reduce(counts)
    return counts.tolist()


def rank_main(rank, out, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=SETTINGS["world"])
    for name, run in SETTINGS["runs"].items():
        steps = train(rank, out, name, run)
        if rank == 0:
            with open(os.path.join(out, f"steps_{name}.json"), "w") as f:
                json.dump(steps, f)
    end_rank()


def main():
    out = sys.argv[1]
    s = SETTINGS
    write_recipe_inputs(out, s, data_seed=321)
    port = free_port()
    mp.spawn(rank_main, args=(out, port), nprocs=s["world"], join=True)
    steps = {name: json.load(open(os.path.join(out, f"steps_{name}.json"))) for name in s["runs"]}
    print(json.dumps(dict(s, steps=steps)))


if __name__ == "__main__":
    main()
