#!/usr/bin/env python3
"""A Markdown table from the JSON lines of bench/gpu/run_gpu_bench.sh.

usage: make_table.py RESULTS.jsonl [--gpu "NVIDIA H100 80GB HBM3"]

Lines that are not JSON objects of that bench (stderr mixed in by `2>&1 | tee`) are ignored.
One row per model x batch x precision, in the order of the file; samples/s per variant. A cell
with several values (repetitions) lists them all and the ratios use their medians. Runs that
failed show "error (n)" with the message under the table; runs not made show "–".
"""
import argparse
import json
import statistics

COLUMNS = [  # (side, variant, header)
    ("ours", "reducer_off", "ours, reducer off"),
    ("ours", "reducer_on", "ours, reducer on"),
    ("ours", "inline", "ours, reducer on, data.num_workers=0"),
    ("ours", "unfused", "ours, reducer on, train.fused=false"),
    ("ours", "cuda_graph", "ours, cuda_graph"),
    ("ours", "cuda_graph_on", "ours, cuda_graph + reducer"),
    ("pytorch", "ddp", "PyTorch DDP eager"),
    ("pytorch", "ddp_fused", "PyTorch DDP eager, SGD(fused=True)"),
    ("pytorch", "ddp_dataloader", "PyTorch DDP eager, fused, DataLoader(num_workers=2)"),
    ("pytorch", "compile", "torch.compile reduce-overhead"),
]


def fmt(v):
    return f"{v:,.0f}".replace(",", " ")  # 88 027, as in RESULTS_gpu.md


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "–"


def load(path):
    env, rows, stopped = {}, {}, None
    with open(path) as f:
        for raw in f:
            raw = raw.strip()
            if raw.startswith("[rank 0] "):
                raw = raw[len("[rank 0] "):]
            if not raw.startswith("{"):
                continue
            try:
                d = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(d, dict) or d.get("bench") != "gpu":
                continue
            if d.get("kind") == "env":
                env = d
            elif "stopped" in d:
                stopped = d
            elif "side" in d and "variant" in d:
                key = (d.get("label") or f'{d.get("model")} b{d.get("batch")}', d.get("batch"), d.get("precision"))
                rows.setdefault(key, {}).setdefault((d["side"], d["variant"]), []).append(d)
    return env, rows, stopped


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="JSON lines of run_gpu_bench.sh")
    p.add_argument("--gpu", help="GPU name for the title (default: the bench's env line)")
    args = p.parse_args()
    env, rows, stopped = load(args.results)
    gpu = args.gpu or env.get("gpu") or "unknown GPU"
    torch_version = env.get("torch")

    out = [f"### Ours vs PyTorch on one {gpu}" + (f" (PyTorch {torch_version})" if torch_version else ""), ""]
    out.append("World 1, NCCL, same model, per-rank batch, SGD and pinned synthetic host data on both sides; "
               "samples/s over the steady-state window (steps W+1..2W). bf16 = autocast around forward and loss.")
    out.append("")
    head = ["model", "batch", "precision"] + [c[2] for c in COLUMNS] + ["ours (on) / best DDP eager",
                                                                        "best ours / compile"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    errors = []
    for (label, batch, precision), cells in rows.items():
        model = label.rsplit(" b", 1)[0] if label.endswith(f" b{batch}") else label
        line = [model, str(batch), str(precision)]
        med = {}
        for side, variant, _ in COLUMNS:
            runs = cells.get((side, variant), [])
            ok = [r["samples_per_s"] for r in runs if isinstance(r.get("samples_per_s"), (int, float))]
            bad = [r for r in runs if r.get("samples_per_s") is None]
            parts = [fmt(v) for v in ok]
            for r in bad:
                errors.append(f"{model} b{batch} {precision}, {side} {variant}: {r.get('error', 'no result')}")
                parts.append(f"error ({len(errors)})")
            line.append(" / ".join(parts) if parts else "–")
            med[(side, variant)] = statistics.median(ok) if ok else None
        for r in cells.get(("pytorch", "compile"), []):
            if r.get("cudagraph_skips") or r.get("graph_breaks"):
                errors.append(f"{model} b{batch} {precision}, torch.compile: cudagraph_skips "
                              f"{r.get('cudagraph_skips')}, graph_breaks {r.get('graph_breaks')} (not all CUDA graphs)")
                line[-1] += f" ({len(errors)})"
        ours = [v for (side, _), v in med.items() if side == "ours" and v is not None]
        eager = [v for v in (med[("pytorch", "ddp")], med[("pytorch", "ddp_fused")],
                             med[("pytorch", "ddp_dataloader")]) if v is not None]
        line.append(ratio(med[("ours", "reducer_on")], max(eager) if eager else None))
        line.append(ratio(max(ours) if ours else None, med[("pytorch", "compile")]))
        out.append("| " + " | ".join(line) + " |")
    if errors:
        out.append("")
        out += [f"({i}) {e}" for i, e in enumerate(errors, 1)]
    out.append("")
    if stopped is None:
        out.append("The bench did not print its last line (killed from outside?): rows may be missing.")
    elif stopped.get("stopped") == "deadline":
        out.append(f"Stopped at the time budget ({stopped.get('deadline_s')} s) after {stopped.get('done')} runs: "
                   "later rows and cells were not run.")
    print("\n".join(out))


if __name__ == "__main__":
    main()
