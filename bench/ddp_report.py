#!/usr/bin/python3
"""Turns run_ddp_bench.sh's JSON lines into bench/RESULTS_ddp.md (medians)."""
import json
import platform
import statistics as st
import sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
versions = next((r for r in rows if r.get("bench") == "versions"), {})
out = ["# DDP engine benchmarks (last run)", "",
       f"`bash bench/run_ddp_bench.sh` on {platform.node()} ({__import__('os').cpu_count()} cores), "
       f"ours built on LibTorch {versions.get('libtorch', '?')} vs Python PyTorch {versions.get('pytorch', '?')} DDP "
       "(earlier LibTorch 1.13 figures: RESULTS_ddp_libtorch1.13.md). "
       "Ours with `backend: auto` (= shm, shared memory, on one host) vs PyTorch DDP with gloo over TCP loopback (its only CPU backend), OMP_NUM_THREADS=1 per rank, synthetic in-memory data, per-rank batch 64. "
       "World 4 oversubscribes a 2-core machine.", "",
       "## Ours vs PyTorch DDP (median samples/s over repetitions; ratio: median of the paired ratios)", "",
       "Each repetition runs the two sides back to back, the side that goes first swapped every repetition; "
       "the ratio is the median of the per-repetition ratios ours / PyTorch (min–max in brackets).", "",
       "| model | world | ours | PyTorch DDP | ratio (min–max) | target |", "|---|---|---|---|---|---|"]
vs = defaultdict(lambda: ([], [], []))
for r in rows:
    if r["bench"] == "vs_pytorch":
        vs[(r["model"], r["world"])][0].append(r["ours"])
        vs[(r["model"], r["world"])][1].append(r["pytorch"])
        vs[(r["model"], r["world"])][2].append(r["ours"] / r["pytorch"])
targets = {"MLP": 2.0, "CNN": 1.3}
for (model, world), (o, t, ratios) in vs.items():
    mo, mt = st.median(o), st.median(t)
    target = next((v for k, v in targets.items() if model == k or model.startswith(k + "-784-512")), 1.0)
    out.append(f"| {model} | {world} | {mo:.0f} | {mt:.0f} | {st.median(ratios):.2f}x "
               f"({min(ratios):.2f}–{max(ratios):.2f}) | {target}x |")
out += ["", "## Overlap (world 2; median step time)", "",
        "| backend | params | buckets | (a) local | (b) all-reduce alone | (c) DDP | hidden share (a+b-c)/b |",
        "|---|---|---|---|---|---|---|"]
for r in rows:
    if r["bench"] == "overlap":
        out.append(f"| {r.get('backend', 'gloo')} | {r['params']:,} | {r['buckets']} | {r['local_s']*1e3:.1f} ms | {r['allreduce_s']*1e3:.1f} ms "
                   f"| {r['ddp_s']*1e3:.1f} ms | {r['hidden_share']:.2f} |")
out += ["", "## All-reduce (our comm layer: gloo over TCP loopback, shm over shared memory), nccl-tests style", "",
        "| backend | world | size | time | algbw GB/s | busbw GB/s | host memcpy GB/s |", "|---|---|---|---|---|---|---|"]
for r in rows:
    if r["bench"] == "allreduce":
        size = r["bytes"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        out.append(f"| {r.get('backend', 'gloo')} | {r['world']} | {label} | {r['time_us']:.0f} us | {r['algbw_GBs']:.2f} | "
                   f"{r['busbw_GBs']:.2f} | {r['memcpy_GBs']:.1f} |")
out += ["", "## Scaling (MLP 784-512-256-10, batch 64 per rank)", "",
        "| world | samples/s | efficiency vs 1 |", "|---|---|---|"]
sc = defaultdict(list)
for r in rows:
    if r["bench"] == "scaling":
        sc[r["world"]].append(r["samples_per_s"])
base = st.median(sc[1]) if sc.get(1) else None
for w in sorted(sc):
    m = st.median(sc[w])
    out.append(f"| {w} | {m:.0f} | {m / (base * w):.2f} |" if base else f"| {w} | {m:.0f} | |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
