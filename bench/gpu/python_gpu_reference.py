#!/usr/bin/env python3
"""The Python side of bench/gpu/run_gpu_bench.sh: PyTorch's DistributedDataParallel on one GPU
(NCCL, cuda:LOCAL_RANK), written the way a careful user would, against our worker on the same
model, per-rank batch, synthetic data, optimizer and steps.

Started by our launcher, which sets torchrun's env contract (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT):
  build/ddp-launch --nproc_per_node=1 python3 bench/gpu/python_gpu_reference.py \\
      --model cnn --batch 64 --warmup 200 --timed 200 --precision bf16 --variant compile

Data: 8192 synthetic samples (randn 1x28x28 images, randint labels, seed 0) in pinned host memory;
each step gathers the batch given by the DistributedSampler's indices (shuffle, seed 0, set_epoch
every epoch) straight into freshly allocated pinned memory (index_select(out=...)) and copies it
with .to(device, non_blocking=True). The pinned blocks come from PyTorch's caching host allocator,
which does not hand a block out again before the asynchronous copy out of it has completed (what
DataLoader(pin_memory=True) relies on), so the host may run ahead of the GPU safely.
Training: SGD(lr 0.01, momentum 0.9), zero_grad(set_to_none=True), cross-entropy; bf16 =
torch.autocast("cuda", torch.bfloat16) around forward and loss (our train.precision=bf16).
--loader dataloader instead: torch.utils.data.DataLoader(TensorDataset, sampler=the DistributedSampler,
num_workers=--workers, pin_memory=True, persistent_workers, drop_last) as the tutorials write it: the
batch is assembled by worker processes, pinned on DataLoader's pin thread, off the main thread (as
our worker's loader threads do, data.num_workers).
Variants: ddp = eager DDP (bucket_cap_mb 25, broadcast_buffers: PyTorch's defaults);
compile = the DDP-wrapped model under torch.compile(mode="reduce-overhead") (CUDA graphs).
Steady state: samples/s over the `timed` steps after `warmup` steps, torch.cuda.synchronize() at
both ends of the window. Rank 0 prints one JSON line; if the compiled variant fails, one JSON line
with "error".

--dry-run: no process group, no GPU: builds the model, runs 2 steps on the CPU (no pinning, eager
even with --variant compile) and prints the JSON line; checks the arguments and the models.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):  # worker/models/models.cc: Linear layers [784]+hidden+[10], ReLU between
    def __init__(self, hidden, inputs=784, classes=10):
        super().__init__()
        widths = [inputs] + hidden + [classes]
        self.layers = nn.ModuleList(nn.Linear(widths[i], widths[i + 1]) for i in range(len(widths) - 1))

    def forward(self, x):
        x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


class Cnn(nn.Module):  # worker/models/models.cc (copied from bench/ddp_reference.py)
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], required=True)
    p.add_argument("--hidden", default="512,256", help="MLP hidden widths, csv (ignored for cnn)")
    p.add_argument("--batch", type=int, default=64, help="per-rank batch")
    p.add_argument("--warmup", type=int, default=200, help="steps before the timed window")
    p.add_argument("--timed", type=int, default=200, help="steps in the timed window")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--variant", choices=["ddp", "ddp_fused", "compile"], default="ddp",
                   help="ddp: eager DDP with SGD's default (foreach on CUDA); ddp_fused: SGD(fused=True)")
    p.add_argument("--samples", type=int, default=8192, help="synthetic training samples")
    p.add_argument("--loader", choices=["gather", "dataloader"], default="gather",
                   help="gather: index_select into pinned memory on the main thread; dataloader: "
                        "DataLoader(num_workers=--workers, pin_memory=True, persistent_workers=True)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (--loader dataloader)")
    p.add_argument("--dry-run", action="store_true", help="CPU, no process group, 2 steps")
    p.add_argument("--profile", metavar="PATH",
                   help="after the timed window, profile --profile-steps more steps with torch.profiler (CPU and "
                        "CUDA activity, prof.step() per step) and write the Chrome trace to PATH (rank 0)")
    p.add_argument("--profile-steps", type=int, default=20)
    args = p.parse_args(argv)
    if args.batch < 1 or args.warmup < 0 or args.timed < 1 or args.samples < args.batch:
        p.error("need batch >= 1, warmup >= 0, timed >= 1, samples >= batch")
    if args.workers < 0:
        p.error("--workers: need >= 0")
    try:
        args.hidden_list = [int(h) for h in args.hidden.split(",") if h.strip()]
    except ValueError:
        p.error(f"--hidden {args.hidden!r}: expected comma-separated integers")
    if args.model == "mlp" and (not args.hidden_list or min(args.hidden_list) < 1):
        p.error("--hidden: the MLP needs at least one positive width")
    return args


def build_model(args):
    return Mlp(args.hidden_list) if args.model == "mlp" else Cnn()


class Batches:
    """The sampler's order, one epoch's permutation at a time (as a tensor: a batch of indices is a
    slice, no per-step Python list); each batch gathered into new pinned host memory."""

    def __init__(self, images, labels, sampler, batch, pin):
        self.images, self.labels, self.sampler, self.batch, self.pin = images, labels, sampler, batch, pin
        self.epoch = 0
        self.perm = torch.empty(0, dtype=torch.long)
        self.pos = 0
        self.checked = False

    def next(self):
        # A remainder shorter than the batch would start a new epoch (it never occurs here: the
        # bench's batches divide 8192; a ragged batch would also make torch.compile recompile).
        if self.pos + self.batch > self.perm.numel():
            self.sampler.set_epoch(self.epoch)
            self.epoch += 1
            self.perm = torch.tensor(list(self.sampler), dtype=torch.long)
            self.pos = 0
        idx = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        x = torch.empty((self.batch,) + tuple(self.images.shape[1:]), dtype=self.images.dtype, pin_memory=self.pin)
        y = torch.empty((self.batch,), dtype=self.labels.dtype, pin_memory=self.pin)
        torch.index_select(self.images, 0, idx, out=x)
        torch.index_select(self.labels, 0, idx, out=y)
        if self.pin and not self.checked:  # index_select(out=) must have kept the pinned storage
            self.checked = True
            if not (x.is_pinned() and y.is_pinned()):
                raise RuntimeError("the gathered batch is not in pinned memory")
        return x, y


class LoaderBatches:
    """DataLoader's batches, epoch after epoch (sampler.set_epoch before each, as DistributedSampler
    asks); the last partial batch is dropped, as Batches never makes one."""

    def __init__(self, images, labels, sampler, batch, workers, pin):
        from torch.utils.data import DataLoader, TensorDataset

        self.sampler = sampler
        self.loader = DataLoader(TensorDataset(images, labels), batch_size=batch, sampler=sampler,
                                 num_workers=workers, pin_memory=pin, drop_last=True,
                                 persistent_workers=workers > 0)
        self.epoch = 0
        self.it = None

    def next(self):
        while True:
            if self.it is None:
                self.sampler.set_epoch(self.epoch)
                self.epoch += 1
                self.it = iter(self.loader)
            try:
                return next(self.it)
            except StopIteration:
                self.it = None


def emit(record):
    print(json.dumps(record), flush=True)


def main():
    args = parse_args()
    from torch.utils.data.distributed import DistributedSampler

    dry = args.dry_run
    if dry:
        device, rank, world = torch.device("cpu"), 0, 1
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    n = args.samples
    images = torch.randn(n, 1, 28, 28)
    labels = torch.randint(0, 10, (n,))
    pin = not dry
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0)
    if args.loader == "dataloader":  # the workers read the dataset; DataLoader pins each batch
        batches = LoaderBatches(images, labels, sampler, args.batch, args.workers, pin)
    else:
        if pin:
            images, labels = images.pin_memory(), labels.pin_memory()
        batches = Batches(images, labels, sampler, args.batch, pin)

    model = build_model(args).to(device)
    if not dry:
        model = DDP(model, device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                          **({"fused": True} if args.variant == "ddp_fused" else {}))
    compiled = args.variant == "compile" and not dry
    step_model = model
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None) if compiled else None
    bf16 = args.precision == "bf16"

    def train_step():
        x, y = batches.next()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if mark_step is not None:
            mark_step()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if not dry:
            if world > 1:
                dist.barrier()
            torch.cuda.synchronize(device)

    warmup, timed = (1, 1) if dry else (args.warmup, args.timed)
    record = {"samples_per_s": None, "seconds": None, "variant": args.variant, "loader": args.loader,
              "workers": args.workers if args.loader == "dataloader" else 0, "precision": args.precision,
              "model": args.model, "batch": args.batch, "world": world, "warmup": warmup, "timed": timed,
              "torch": torch.__version__}
    if not dry:
        record["device"] = torch.cuda.get_device_name(device)
    t_setup = time.perf_counter()
    try:
        if compiled:  # lazy: the compilation itself happens in the first steps
            step_model = torch.compile(model, mode="reduce-overhead")
        for _ in range(warmup):
            train_step()
        sync()
        start = time.perf_counter()
        for _ in range(timed):
            loss = train_step()
        sync()
        seconds = time.perf_counter() - start
        if args.profile and rank == 0:
            # After the timed window, so the figures above are not the profiler's.
            # A schedule, so prof.step() marks each step (ProfilerStep#k) as output.profile_start does.
            from torch.profiler import ProfilerActivity, profile, schedule

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=args.profile_steps, repeat=1),
                         on_trace_ready=lambda p: p.export_chrome_trace(args.profile)) as prof:
                for _ in range(args.profile_steps + 1):
                    train_step()
                    sync()  # the last active step's GPU work inside the trace
                    prof.step()
            record["profile"] = args.profile
    except Exception as e:  # noqa: BLE001 - the compiled variant reports, the eager one raises
        if not compiled:
            raise
        if rank == 0:
            msg = str(e).strip().splitlines()
            record["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:500]
            emit(record)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)
    record["samples_per_s"] = timed * args.batch * world / seconds
    record["seconds"] = seconds
    record["warmup_s"] = start - t_setup  # includes torch.compile's compilation
    record["final_loss"] = float(loss.detach())
    if compiled:
        try:
            from torch._dynamo.utils import counters

            record["cudagraph_skips"] = counters["inductor"].get("cudagraph_skips", 0)
            record["graph_breaks"] = sum(counters["graph_break"].values())
        except Exception:  # noqa: BLE001 - diagnostics only
            pass
    if dry:
        record["dry_run"] = True
        record["params"] = sum(p.numel() for p in model.parameters())
        if args.variant == "compile":
            record["note"] = "dry run: eager, torch.compile not exercised"
    if rank == 0:
        emit(record)
    sys.stdout.flush()
    sys.stderr.flush()
    # The pinned torch wheel's Gloo/NCCL teardown can abort at exit: leave without it.
    os._exit(0)


if __name__ == "__main__":
    main()
