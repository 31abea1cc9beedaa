#!/usr/bin/python3
"""Turns the rounds of bench/dp/run_dp_compare.sh into RESULTS_dp.md and a PNG chart.

usage: report.py OUT_DIR RESULTS.md CHART.png cpu|cuda

OUT_DIR holds meta.json and r1/, r2/, ...: per configuration NAME a folder NAME/ (the worker's
summary.json and metrics.jsonl) or NAME.json (PyTorch's rate), NAME.cmd (the command), NAME.load
(the 1-minute load average when it started). samples/s is the steady rate: from the metrics line of
step train.log_every (the end of the first log window) to the last line, so start-up and warm-up are
left out; PyTorch's reference times the same steps after the same warm-up. Ratios are paired: both
sides from the same round (the order rotates round by round), then the median over the rounds.
"""
import json
import os
import statistics as st
import sys

ACCURACY_TOLERANCE_PP = 1.0  # all modes run the same batches; only rounding differs
COLORS = {"single": (120, 120, 120), "dp": (214, 96, 77), "ddp": (67, 147, 195), "ddpgloo": (120, 180, 220),
          "torch": (238, 160, 40), "dpuneven": (240, 150, 130), "single1uneven": (180, 180, 180)}
HISTORY = ("Earlier versions of this file (2026-11-22 and a 2026-11-29 draft) had one run per row, in a fixed "
           "order, and samples/s over the whole loop (start-up steps and warm-up included), with no PyTorch row: "
           "e.g. single (1) 2188 / 2836, dp (2) 3314 / 5603, ddp (2) 4200 / 3060 samples/s. A second run of that "
           "draft minutes later moved single (2) from 4160 to 1141 and dp (4) from 1579 to 2933, so those figures "
           "ranked the modes by the load of the moment and are not comparable with the paired ratios here.")


def mode_of(name):
    return name.rsplit("_", 1)[0] if "_" in name else "single1uneven"


def devices_of(name):
    return 1 if name.startswith("single1uneven") else int(name.rsplit("_", 1)[1])


def steady_rate(metrics, log_every):
    recs = [json.loads(l) for l in open(metrics) if l.strip()]
    recs = [r for r in recs if {"step", "samples", "elapsed_s"} <= r.keys()]
    anchor = next((r for r in recs if r["step"] >= log_every), None)
    last = recs[-1] if recs else None
    if anchor is None or last is anchor:
        raise SystemExit(f"report: {metrics} has no log line after step {log_every}; run more steps")
    return (last["samples"] - anchor["samples"]) / (last["elapsed_s"] - anchor["elapsed_s"]), anchor["step"], last["step"]


def load_runs(out, meta):
    """runs[name] = list over rounds of dicts (rate, whole, load, rss, acc, batch, cmd, position)."""
    runs = {name: [] for name in meta["configs"]}
    for r in range(1, meta["reps"] + 1):
        order = meta["orders"][r - 1].split(",")
        for name in meta["configs"]:
            base = os.path.join(out, f"r{r}", name)
            run = {"round": r, "position": order.index(name) + 1}
            with open(base + ".load") as f:
                run["load"] = float(f.read().split()[0])
            with open(base + ".cmd") as f:
                run["cmd"] = f.read().strip()
            if name.startswith("torch_"):
                with open(base + ".json") as f:
                    run["rate"] = json.load(f)["samples_per_s"]
            else:
                with open(os.path.join(base, "summary.json")) as f:
                    s = json.load(f)
                run["rate"], run["from_step"], run["to_step"] = steady_rate(os.path.join(base, "metrics.jsonl"),
                                                                            meta["log_every"])
                run["whole"] = s["samples_per_s"]
                run["acc"] = s.get("test_accuracy")
                run["batch"] = s.get("global_batch_size")
                run["samples"] = s.get("samples")
                run["rss"] = s.get("peak_rss_mb_per_process", [s.get("peak_rss_mb", 0.0)])
                if meta["kind"] == "cuda" and s.get("gpus"):
                    run["rss"] = [g["peak_allocated_mb"] for g in s["gpus"]]
            runs[name].append(run)
    return runs


def label(name, meta):
    n = devices_of(name)
    kind = meta["kind"]
    mode = mode_of(name)
    unit = "GPU" if kind == "cuda" else "thread"
    text = {
        "single": f"single, {n} intra-op thread{'s' if n > 1 else ''}" if kind == "cpu" else "single, 1 GPU",
        "dp": f"dp, {n} replica{'s' if n > 1 else ''} ({unit}s in 1 process)",
        "ddp": f"ddp (ours, backend auto), {n} process{'es' if n > 1 else ''}",
        "ddpgloo": f"ddp (ours, backend gloo), {n} processes",
        "torch": f"PyTorch DDP (Gloo{' / NCCL' if kind == 'cuda' else ''}), {n} processes",
        "dpuneven": f"dp, {n} replicas, uneven batch",
        "single1uneven": "single, 1 thread, uneven batch" if kind == "cpu" else "single, 1 GPU, uneven batch",
    }[mode]
    if name in meta.get("oversubscribed", []):
        text += f" — **oversubscribed** ({n} on {meta['cores']} cores)"
    return text


def pairs(meta, runs):
    """(label, numerator, denominator) for every ratio this run can pair."""
    have = set(runs)
    out = []
    ns = sorted({devices_of(n) for n in have if not n.startswith("single1uneven")})
    for n in ns:
        if n == 1:
            for a in ("dp_1", "ddp_1"):
                if a in have:
                    out.append((f"{a.split('_')[0]} (1) / single (1)", a, "single_1"))
            continue
        for a, b, text in ((f"single_{n}", "single_1", f"single ({n}) / single (1)"),
                           (f"dp_{n}", "single_1", f"dp ({n}) / single (1)"),
                           (f"dp_{n}", f"single_{n}", f"dp ({n}) / single ({n})"),
                           (f"ddp_{n}", "single_1", f"ddp ({n}) / single (1)"),
                           (f"ddp_{n}", f"single_{n}", f"ddp ({n}) / single ({n})"),
                           (f"dp_{n}", f"ddp_{n}", f"dp ({n}) / ddp ({n})"),
                           (f"ddp_{n}", f"torch_{n}", f"ours ddp ({n}) / PyTorch DDP ({n})"),
                           (f"ddpgloo_{n}", f"torch_{n}", f"ours ddp over Gloo ({n}) / PyTorch DDP ({n})"),
                           (f"dp_{n}", f"torch_{n}", f"ours dp ({n}) / PyTorch DDP ({n})")):
            if a in have and b in have:
                out.append((text, a, b))
        unev = next((x for x in have if x == f"dpuneven_{n}"), None)
        if unev:
            batch = runs[unev][0]["batch"]
            base = f"single1uneven{batch}"
            if base in have:
                out.append((f"dp ({n}), batch {batch} / single (1), batch {batch}", unev, base))
    return out


def fmt_range(values, f="{:.2f}"):
    return f"{f.format(min(values))}–{f.format(max(values))}"


def chart(meta, runs, ratio_rows, path):
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        print("report: PIL not installed; no chart written (pip install pillow)")
        return False
    W, H, pad = 1200, 520, 60
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    # Left: steady samples/s per configuration, median bar, min–max whisker.
    x0, y0, y1, pw = pad + 10, 50, H - 120, 520
    names = list(runs)
    vmax = max(r["rate"] for v in runs.values() for r in v) * 1.15
    d.text((x0, 20), f"steady samples/s, median of {meta['reps']} rounds (whisker: min-max)", fill="black", font=font)
    d.line([(x0, y0), (x0, y1), (x0 + pw, y1)], fill="black")
    for t in range(5):
        v = vmax * t / 4
        y = y1 - (y1 - y0) * t / 4
        d.line([(x0 - 4, y), (x0, y)], fill="black")
        d.text((x0 - 45, y - 6), f"{v:.0f}", fill="black", font=font)
    bw = pw / len(names)
    for i, name in enumerate(names):
        rates = [r["rate"] for r in runs[name]]
        med = st.median(rates)
        bx = x0 + i * bw + 4
        h = (y1 - y0) * med / vmax
        d.rectangle([bx, y1 - h, bx + bw - 8, y1], fill=COLORS.get(mode_of(name), (150, 150, 150)))
        cx = bx + (bw - 8) / 2
        lo, hi = (y1 - (y1 - y0) * v / vmax for v in (min(rates), max(rates)))
        d.line([(cx, lo), (cx, hi)], fill="black")
        d.text((bx, y1 - h - 24), f"{med:.0f}", fill="black", font=font)
        for j, part in enumerate(name.replace("single1uneven", "single1_unev").split("_")):
            d.text((bx, y1 + 6 + 12 * j), part, fill="black", font=font)
    # Right: median paired ratios, min–max whisker, a line at 1.
    rx0, rpw = x0 + pw + 90, W - (x0 + pw + 90) - 20
    d.text((rx0 - 60, 20), "paired ratios (median over rounds; whisker: min-max)", fill="black", font=font)
    rows = ratio_rows
    # The scale follows the medians; a whisker past it (a round hit by other work) is cut with a ">".
    rmax = max(2.0, max(st.median(v) for _, v in rows) * 1.3) if rows else 2
    ry0, ry1 = y0, H - 40
    rh = (ry1 - ry0) / max(len(rows), 1)
    for i, (text, vals) in enumerate(rows):
        y = ry0 + i * rh
        med = st.median(vals)
        w = rpw * 0.45 * med / rmax
        bx = rx0 + rpw * 0.55
        d.text((rx0 - 60, y + 2), text[:52], fill="black", font=font)
        d.rectangle([bx, y + 2, bx + w, y + rh - 4], fill=(67, 147, 195) if med >= 1 else (214, 96, 77))
        lo, hi = (bx + rpw * 0.45 * min(v, rmax) / rmax for v in (min(vals), max(vals)))
        d.line([(lo, y + rh / 2), (hi, y + rh / 2)], fill="black")
        if max(vals) > rmax:
            d.text((hi - 44, y + rh / 2 + 1), f"> {max(vals):.1f}x", fill="black", font=font)
        d.text((bx + w + 4, y + 2), f"{med:.2f}x", fill="black", font=font)
    one = rx0 + rpw * 0.55 + rpw * 0.45 / rmax
    d.line([(one, ry0), (one, ry1)], fill=(0, 0, 0))
    d.text((one - 6, ry1 + 4), "1x", fill="black", font=font)
    d.text((pad, H - 22), f"Fashion-MNIST CNN, global batch {meta['global_batch']}, {meta['kind'].upper()}, "
           f"{meta['cores']} cores, {meta['start_utc'][:10]}", fill="black", font=font)
    img.save(path)
    return True


def main():
    out, results, png, kind = sys.argv[1:5]
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    meta["kind"] = kind
    runs = load_runs(out, meta)
    if "single_1" not in runs:
        sys.exit("report: the single-device baseline is missing")

    # Per configuration.
    mem_label = "peak allocated per GPU (MB)" if kind == "cuda" else "peak RSS per process (MB)"
    lines = [f"| configuration | global batch | samples/s, median (min–max) | whole loop samples/s, median | {mem_label} | "
             "test accuracy | Δ vs single (1), same batch (pp) | load before (min–max) |",
             "|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    acc_of = {}
    for name, rs in runs.items():
        if not name.startswith("torch_"):
            acc_of[name] = st.median(r["acc"] for r in rs)
    for name, rs in runs.items():
        rates = [r["rate"] for r in rs]
        loads = [r["load"] for r in rs]
        if name.startswith("torch_"):
            n = devices_of(name)
            lines.append(f"| {label(name, meta)} | {meta['global_batch']} ({meta['global_batch'] // n} per rank) | "
                         f"{st.median(rates):.0f} ({fmt_range(rates, '{:.0f}')}) | – | – | – (synthetic data) | – | "
                         f"{fmt_range(loads)} |")
            continue
        batch = rs[0]["batch"]
        base = "single_1" if batch == meta["global_batch"] else f"single1uneven{batch}"
        delta = 100 * (acc_of[name] - acc_of.get(base, acc_of[name]))
        worst = max(worst, abs(delta))
        rss = [st.median(r["rss"][i] for r in rs) for i in range(len(rs[0]["rss"]))]
        lines.append(f"| {label(name, meta)} | {batch} | {st.median(rates):.0f} ({fmt_range(rates, '{:.0f}')}) | "
                     f"{st.median(r['whole'] for r in rs):.0f} | {' / '.join(f'{m:.0f}' for m in rss)} | "
                     f"{100 * acc_of[name]:.2f} % | {delta:+.2f} | {fmt_range(loads)} |")

    # Paired ratios, round by round.
    ratio_rows = []
    rlines = ["| ratio | " + " | ".join(f"round {r}" for r in range(1, meta["reps"] + 1)) + " | median | min–max |",
              "|---|" + "---|" * (meta["reps"] + 2)]
    for text, a, b in pairs(meta, runs):
        vals = [ra["rate"] / rb["rate"] for ra, rb in zip(runs[a], runs[b])]
        ratio_rows.append((text, vals))
        over = " (oversubscribed)" if a in meta.get("oversubscribed", []) or b in meta.get("oversubscribed", []) else ""
        rlines.append(f"| {text}{over} | " + " | ".join(f"{v:.2f}×" for v in vals)
                      + f" | **{st.median(vals):.2f}×** | {fmt_range(vals)} |")

    ok = worst <= ACCURACY_TOLERANCE_PP
    has_chart = chart(meta, runs, ratio_rows, png)
    s1 = runs["single_1"][0]
    cmds = []
    for name, rs in runs.items():
        cmds.append(f"    # {name}\n    " + rs[0]["cmd"].replace(root + "/", "").replace(os.path.abspath(out) + "/", "$DP_BENCH_OUT/"))
    skipped = "" if meta.get("oversubscribe") else (
        f" Rows with more threads / processes / replicas than the machine's {meta['cores']} cores were skipped "
        "(`OVERSUBSCRIBE=1` runs and labels them).")
    doc = [
        "# DP vs DDP vs single vs PyTorch DDP — results",
        "",
        f"Command: `{meta['invocation']}` ({meta['start_utc'][:10]}, {kind.upper()}, {meta['cores']} CPU cores). "
        f"Commit `{meta['head']}`" + (f" (plus {meta['dirty_files']} uncommitted tracked files in the work tree)"
                                       if meta.get("dirty_files") else "")
        + f"; ours on LibTorch {meta['libtorch']} (`build/libtorch_version.txt`), the reference on PyTorch "
        f"{meta['pytorch']}. {meta['reps']} rounds from {meta['start_utc']} to {meta['end_utc']}; each round runs "
        "every configuration once, the order rotated by one each round. Load average (1, 5, 15 min) at the start "
        f"{meta['load_start']}, at the end {meta['load_end']}.{skipped}",
        "",
        f"**Caveat: this machine has {meta['cores']} cores and was not reserved** — other work (builds, Python jobs) "
        "ran on the same cores during the run (the load column), so single samples/s figures swing by ±30 % or more "
        "between runs minutes apart. Read the paired ratios (both sides from the same round), not the absolute "
        "figures.",
        "",
        f"Every one of our runs trains the Fashion-MNIST CNN on the same {s1['samples']} samples in the same global "
        f"batches of {meta['global_batch']} (single: batch {meta['global_batch']}; dp: the batch split over the "
        f"replicas by torch.chunk; ddp: {meta['global_batch']}/N per process), SGD lr 0.05 momentum 0.9, one "
        "intra-op thread per replica / process (single: N intra-op threads), then tests on all 10 000 test images. "
        "PyTorch DDP: `bench/ddp_reference.py cnn` — the same CNN layers under torch's DistributedDataParallel over "
        "Gloo (its only CPU backend), OMP_NUM_THREADS=1 per rank, the same per-rank batch, the same number of steps "
        "and warm-up, on synthetic in-memory data of the same shape (the step costs the same; its accuracy is not "
        "comparable). The uneven case: dp with a global batch that torch.chunk splits unevenly over the replicas "
        "(129 over 2: 65 + 64; 130 over 4: 33 + 33 + 33 + 31), against single on the same batch, so dp's scatter "
        "runs uneven parts (and a partial last batch).",
        "",
        "## Paired ratios of steady samples/s",
        "",
        *rlines,
        "",
        "## Per configuration",
        "",
        *lines,
        "",
        f"Accuracy agreement: {'PASS' if ok else 'FAIL'} — largest deviation from single (1) on the same batch is "
        f"{worst:.2f} percentage points (tolerance {ACCURACY_TOLERANCE_PP} pp: the modes compute the same batches, "
        "so only floating-point summation order differs).",
        "",
        f"- samples/s: the steady rate, training samples per second of wall time from the metrics line of step "
        f"{meta['log_every']} (the end of the first log window: start-up and warm-up left out) to the last logged "
        f"step; PyTorch: the steps after the same {meta['log_every']}-step warm-up. \"whole loop\": summary.json's "
        "figure over the whole loop (warm-up included), for comparison with older tables.",
        "- ratios: each from one round's pair of runs, minutes apart at most; the median over the rounds is the "
        "figure to quote, the min–max its spread on this machine.",
        "- load before: the 1-minute load average when each run started; above the core count other work was "
        "competing for the cores.",
        "- memory: CPU — peak resident set (VmHWM) of each process: one for single and dp (all replicas share it), "
        "one per rank for ddp; GPU — the caching allocator's peak allocated bytes per device.",
        "",
        "Exact commands (round 1; the other rounds differ only in `r1`; paths relative to the repository root, "
        "where the script runs them):",
        "",
        *cmds,
        "",
        f"Before: {HISTORY}",
    ]
    if has_chart:
        doc += ["", f"![DP vs DDP vs single vs PyTorch DDP]({os.path.basename(png)})"]
    with open(results, "w") as f:
        f.write("\n".join(doc) + "\n")
    print("\n".join(rlines))
    print("\n".join(lines))
    print(f"accuracy agreement {'PASS' if ok else 'FAIL'} (max {worst:.2f} pp); wrote {results}"
          + (f" and {png}" if has_chart else ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
