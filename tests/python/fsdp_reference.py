#!/usr/bin/env python3
"""The reference for tests/libddp/fully_shard_test.cc: PyTorch's own FSDP2 (fully_shard on a CPU
DeviceMesh over Gloo) trains the test's model from the initial weights and batches the C++ test
wrote, with each block a unit and then the root, as the C++ test shards it.

Usage: fsdp_reference.py INIT.pt WORLD STEPS
INIT.pt (torch.save of a dict): the model's parameters by their names, "x.<step>.<rank>" and
"y.<step>.<rank>" the batches. Prints JSON on stdout: for each run ("sgd", "adamw", "adamw_keep" =
AdamW with reshard_after_forward=False, "sgd_bf16" = SGD with
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), "sgd_keep" and "sgd_bf16_keep" the
same with reshard_after_forward=False: FSDP2's nearest to the C++ side's ZeRO-2, replicateParameters)
the final full parameters by name (flattened) and, per rank, each parameter's local shard shape
(DTensor.to_local())."""
import json
import multiprocessing as mp
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(7, 4)
        self.fc2 = nn.Linear(4, 7)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Net(nn.Module):
    """tests/libddp/fully_shard_test.cc's NetImpl, parameter for parameter."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 7)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(7, 3)

    def forward(self, x):
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


RUNS = {
    "sgd": (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), {}),
    "adamw": (lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1), {}),
    "adamw_keep": (lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
                   {"reshard_after_forward": False}),
    "sgd_bf16": (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
                 {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}),
    "sgd_keep": (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), {"reshard_after_forward": False}),
    "sgd_bf16_keep": (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
                      {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                       "reshard_after_forward": False}),
}


def train(rank, world, steps, data, make_optimizer, kwargs):
    model = Net()
    model.load_state_dict({k: v for k, v in data.items() if not k.startswith(("x.", "y."))})
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    shapes = {name: list(p.to_local().shape) for name, p in model.named_parameters()}
    optimizer = make_optimizer(model.parameters())
    for step in range(steps):
        optimizer.zero_grad()
        out = model(data[f"x.{step}.{rank}"])
        nn.functional.mse_loss(out, data[f"y.{step}.{rank}"]).backward()
        optimizer.step()
    params = {name: p.full_tensor().detach().reshape(-1).tolist() for name, p in model.named_parameters()}
    return {"params": params, "shapes": shapes}


def worker(rank, world, steps, init_path, store_path, out_path):
    try:
        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        data = torch.load(init_path)
        result = {name: train(rank, world, steps, data, *run) for name, run in RUNS.items()}
        with open(f"{out_path}.{rank}", "w") as f:
            json.dump(result, f)
        dist.barrier()
        code = 0
    except Exception as e:  # noqa: BLE001: reported, then the process ends with 1
        print(f"fsdp_reference rank {rank}: {e!r}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the wheel's Gloo can abort in the interpreter's teardown


def main():
    init_path, world, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result")
        context = mp.get_context("fork")  # the children inherit the imported torch: no re-import
        procs = [context.Process(target=worker, args=(r, world, steps, init_path, os.path.join(tmp, "store"), out_path))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            print(f"fsdp_reference: exit codes {[p.exitcode for p in procs]}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        results = []
        for r in range(world):
            with open(f"{out_path}.{r}") as f:
                results.append(json.load(f))
    merged = {}
    for name in RUNS:
        merged[name] = {"params": results[0][name]["params"], "shapes": [res[name]["shapes"] for res in results]}
    print(json.dumps(merged))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
