#!/usr/bin/env python3
"""The table of bench/gpt/run_gpu.sh's JSON lines: per variant (eager; ours cuda_graph against
nanoGPT's torch.compile), each rep's tokens/s of both sides and their ratio, MFU and peak memory.

    python3 bench/gpt/gpu_table.py gpt.jsonl
"""
import json
import sys

PAIRS = [("eager", "eager", "eager", "ours eager vs nanoGPT eager (target >= 1.1x)"),
         ("graph", "graph", "compile", "ours train.cuda_graph vs nanoGPT torch.compile (target >= 1.0x)")]


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    env = next((r for r in rows if r.get("kind") == "env"), {})
    runs = [r for r in rows if "side" in r]
    print(f"GPU: {env.get('gpu', '?')}, torch {env.get('torch', '?')}; model {env.get('model', '?')}, "
          f"vocab 50304, batch {env.get('batch', '?')} x block {env.get('block', '?')}, {env.get('dtype', '?')}, "
          f"{env.get('steps', '?')} steps, median of {env.get('log', '?')}-step windows after step {env.get('skip', '?')}\n")
    print("| comparison | rep | ours tokens/s | nanoGPT tokens/s | ratio | ours MFU | nanoGPT MFU | ours peak MB | nanoGPT peak MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, ours_variant, their_variant, title in PAIRS:
        reps = sorted({r["rep"] for r in runs if r["variant"] in (ours_variant, their_variant)})
        for rep in reps:
            a = next((r for r in runs if r["side"] == "ours" and r["variant"] == ours_variant and r["rep"] == rep), None)
            b = next((r for r in runs if r["side"] == "nanogpt" and r["variant"] == their_variant and r["rep"] == rep), None)
            ta = a.get("tokens_per_s") if a else None
            tb = b.get("tokens_per_s") if b else None
            ratio = ta / tb if ta and tb else None
            mfu_a = a.get("mfu") if a else None
            mfu_b = mfu_a * tb / ta if mfu_a and ta and tb else None
            print(f"| {title} | {rep} | {fmt(ta, ',.0f')} | {fmt(tb, ',.0f')} | {fmt(ratio, '.2f')}{'×' if ratio else ''} "
                  f"| {fmt(mfu_a and 100 * mfu_a, '.1f')}{'%' if mfu_a else ''} | {fmt(mfu_b and 100 * mfu_b, '.1f')}{'%' if mfu_b else ''} "
                  f"| {fmt(a.get('peak_mb') if a else None, ',.0f')} | {fmt(b.get('peak_mb') if b else None, ',.0f')} |")
    failed = [r for r in runs if "failed" in r]
    for r in failed:
        print(f"\nfailed: {r['side']} {r['variant']} rep {r['rep']}: {r['failed']}")
    end = next((r for r in rows if "stopped" in r), None)
    if end:
        print(f"\n{end['done']} runs, {end['seconds']} s, stopped: {end['stopped']}")


if __name__ == "__main__":
    main(sys.argv[1])
