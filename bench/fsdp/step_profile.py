#!/usr/bin/env python3
"""Where a fully sharded step's CPU time goes, ours (fsdp_memory_bench --mode full) and PyTorch's
FSDP2 (fsdp2_memory.py --mode full), from `perf script --no-inline` output of a run recorded with
`perf record -F HZ --call-graph dwarf` (bench/fsdp/step_profile.sh). Each sample of a rank's
threads after its first matrix multiply (its first sgemm: the model's construction, imports and start-up left out)
goes to one category, by the frames of its stack (the C++ frames; Python's own are opaque):

  collective        the exchange itself: ours ddp::comm::ShmCommunicator (the slots' memcpy, the
                    reduction, the barrier's spin), theirs Gloo's threads and c10d calls
  fallback          ours only: Communicator::allGather / reduceScatter built on all_reduce
                    (comm/communicator.h): the zero-filled (world, S) block, at::stack, per-rank copies
  copy-in/out       ours: ShardLayout::packGradient (reduce-scatter input), at::stack + copyOut
                    (all-gather output); theirs: _chunk_cat, foreach copy, split_with_sizes_copy
  optimizer         AdamW (ours torch::optim::AdamW::step, theirs the ops of _single_tensor_adamw)
  compute           the model's ops: MKL's sgemm (by the sample's own frame: MKL's frames do not
                    unwind), the others by their op (autograd's engine in the stack: backward)
  other             anything else (zero_grad, the loss, Python's interpreter, allocator frees)

and separately, whatever the category, the share spent in the kernel's page-fault path (fresh
pages of a new allocation being zeroed) and in munmap (a large tensor freed).

  python3 step_profile.py --hz 499 --steps 8 o1.txt [o2.txt ...] vs t1.txt [t2.txt ...]
"""
import argparse
import collections
import re
import sys

OP = re.compile(r"at::_ops::(\w+?)::(?:call|redispatch)")
OPTIM = {"lerp_", "addcmul_", "addcdiv_", "sqrt", "div_", "div", "mul_", "_foreach_lerp_", "_foreach_mul_",
         "_foreach_addcmul_", "_foreach_addcdiv_", "_foreach_sqrt", "_foreach_div_", "_foreach_add_"}


def samples(path):
    head, frames = None, []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if head:
                    yield head, frames
                head, frames = None, []
            elif not line[0].isspace():
                parts = line.split()
                pid, tid = parts[-2].split("/")
                head = (parts[0], int(pid), int(tid), float(parts[-1].rstrip(":")))
            else:
                frames.append(line.strip().split(" ", 1)[-1])
    if head:
        yield head, frames


def classify(comm, frames):
    text = "\n".join(frames)
    has = lambda s: s in text
    if comm.startswith(("gloo_tcp", "pt_gloo")) or has("gloo::") or has("ProcessGroupGloo") or has("c10d::"):
        return "collective"
    if has("ShmCommunicator"):
        return "collective"
    if has("Communicator::allGather") or has("Communicator::reduceScatter"):
        return "fallback (gather/scatter on all_reduce)"
    if has("packGradient") or has("_chunk_cat") or has("chunk_cat"):
        return "copy-in (reduce-scatter input)"
    if has("copyOut") or (has("finishUnshard") and has("at::native::stack")) or has("split_with_sizes_copy"):
        return "copy-out (all-gather output)"
    if has("_foreach_copy") or has("all_gather_copy_in"):
        return "copy-in (all-gather input)"
    if has("AdamW::step"):
        return "optimizer"
    if frames and "memmove" in frames[0]:
        return "memcpy (glibc's frames do not unwind: ours the shm slots and at::stack, theirs cat)"
    if has("gc_collect"):
        return "Python's garbage collector"
    if frames and ("mkl_blas" in frames[0] or "sgemm" in frames[0]):
        return "compute: matmul (MKL; its frames do not unwind)"
    ops = [m.group(1) for m in map(OP.search, frames) if m]
    outer = ops[-1] if ops else None
    if outer in OPTIM and not has("torch::autograd::Engine"):
        return "optimizer"
    if outer is not None:
        return "compute: other ops, backward" if has("torch::autograd::Engine") else "compute: other ops, forward"
    if has("libpython") or has("_PyEval"):
        return "Python's interpreter"
    return "other"


def profile(paths, hz, steps):
    cats = collections.Counter()
    faults = collections.Counter()
    ranks = 0
    for path in paths:
        by_pid = collections.defaultdict(list)
        for head, frames in samples(path):
            by_pid[head[1]].append((head, frames))
        for pid, items in by_pid.items():
            starts = [h[3] for h, fr in items if fr and "mkl_blas" in fr[0]]
            if len(starts) < 20:
                continue  # the launcher, torchrun's agent
            ranks += 1
            t0 = min(starts)
            for (comm, _, _, t), frames in items:
                if t < t0:
                    continue
                c = classify(comm, frames)
                cats[c] += 1
                text = "\n".join(frames)
                if "asm_exc_page_fault" in text:
                    faults["page faults"] += 1
                elif "__munmap" in text or "__vm_munmap" in text:
                    faults["munmap"] += 1
    scale = 1.0 / hz / steps / max(ranks, 1)
    return {k: v * scale for k, v in cats.items()}, {k: v * scale for k, v in faults.items()}, ranks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hz", type=float, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    cut = a.files.index("vs") if "vs" in a.files else len(a.files)
    sides = {"ours": a.files[:cut], "FSDP2": a.files[cut + 1:]}
    results = {name: profile(paths, a.hz, a.steps) for name, paths in sides.items() if paths}
    order = ["compute: matmul (MKL; its frames do not unwind)", "compute: other ops, forward",
             "compute: other ops, backward", "optimizer", "collective", "fallback (gather/scatter on all_reduce)",
             "copy-in (all-gather input)", "copy-out (all-gather output)", "copy-in (reduce-scatter input)",
             "memcpy (glibc's frames do not unwind: ours the shm slots and at::stack, theirs cat)",
             "Python's garbage collector", "Python's interpreter", "other"]
    names = list(results)
    print("| CPU s per step per rank | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for c in order:
        print(f"| {c} | " + " | ".join(f"{results[n][0].get(c, 0):.3f}" for n in names) + " |")
    print("| **total** | " + " | ".join(f"**{sum(results[n][0].values()):.3f}**" for n in names) + " |")
    for c in ["page faults", "munmap"]:
        print(f"| of which in the kernel's {c} | " + " | ".join(f"{results[n][1].get(c, 0):.3f}" for n in names) + " |")
    print("ranks: " + ", ".join(f"{n} {results[n][2]}" for n in names), file=sys.stderr)


if __name__ == "__main__":
    main()
