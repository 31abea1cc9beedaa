#!/usr/bin/python3
"""Turns the summaries of bench/dp/run_dp_compare.sh into RESULTS_dp.md and a PNG chart.

usage: report.py OUT_DIR RESULTS.md CHART.png cpu|cuda
"""
import datetime
import json
import os
import platform
import sys

ACCURACY_TOLERANCE_PP = 1.0  # all modes run the same batches; only rounding differs
MODES = ["single", "dp", "ddp"]
COLORS = {"single": (120, 120, 120), "dp": (214, 96, 77), "ddp": (67, 147, 195)}


def load(out):
    runs = {}
    for mode in MODES:
        for n in (1, 2, 4):
            path = os.path.join(out, f"{mode}_{n}", "summary.json")
            if os.path.exists(path):
                with open(path) as f:
                    runs[(mode, n)] = json.load(f)
                load = os.path.join(out, f"{mode}_{n}.load")
                if os.path.exists(load):
                    with open(load) as f:
                        runs[(mode, n)]["_load"] = f.read().strip()
    return runs


def memory_per_device(s, kind):
    # The worker's GPU report: per rank (ddp) or replica (dp), peak allocated on its GPU.
    if kind == "cuda" and s.get("gpus"):
        return [g["peak_allocated_mb"] for g in s["gpus"]]
    if kind == "cuda" and "cuda_peak_allocated_mb_per_device" in s:
        return s["cuda_peak_allocated_mb_per_device"]
    return s.get("peak_rss_mb_per_process", [s.get("peak_rss_mb", 0.0)])


def table(runs, kind):
    base = runs[("single", 1)]
    mem_label = "peak allocated per GPU (MB)" if kind == "cuda" else "peak RSS per process (MB)"
    lines = [
        f"| mode | devices | samples/s | speed-up vs single (1) | {mem_label} | total (MB) | main-device share | test accuracy | Δ vs single (pp) | load before |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for n in (1, 2, 4):
        for mode in MODES:
            s = runs.get((mode, n))
            if s is None:
                continue
            mem = memory_per_device(s, kind)
            total = sum(mem)
            share = mem[0] / total if total > 0 else 1.0
            acc = 100 * s["test_accuracy"]
            delta = acc - 100 * base["test_accuracy"]
            worst = max(worst, abs(delta))
            devices = f"{n} (process{'es' if n > 1 else ''})" if mode == "ddp" else str(n)
            if mode == "dp":
                devices = f"{n} ({'threads' if kind == 'cpu' else 'GPUs'} in 1 process)"
            if mode == "single" and kind == "cpu":
                devices = f"{n} (intra-op threads)"
            lines.append(
                f"| {mode} | {devices} | {s['samples_per_s']:.0f} | {s['samples_per_s'] / base['samples_per_s']:.2f}× | "
                f"{' / '.join(f'{m:.0f}' for m in mem)} | {total:.0f} | {100 * share:.0f} % | {acc:.2f} % | {delta:+.2f} | "
                f"{s.get('_load', '?')} |")
    return lines, worst


def chart(runs, kind, path):
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        print("report: python3-pil not installed; no chart written (apt-get install python3-pil)")
        return False
    W, H, pad = 1000, 460, 60
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    panels = [("samples/s (higher is better)", lambda s: s["samples_per_s"]),
              ("main-device peak memory, MB" + (" (GPU 0)" if kind == "cuda" else " (RSS of the process on it)"),
               lambda s: memory_per_device(s, kind)[0])]
    pw = (W - 3 * pad) // 2
    for p, (title, value) in enumerate(panels):
        x0, y0, y1 = pad + p * (pw + pad), 50, H - 70
        vmax = max(value(s) for s in runs.values()) * 1.15
        d.text((x0, 20), title, fill="black", font=font)
        d.line([(x0, y0), (x0, y1), (x0 + pw, y1)], fill="black")
        for t in range(5):
            v = vmax * t / 4
            y = y1 - (y1 - y0) * t / 4
            d.line([(x0 - 4, y), (x0, y)], fill="black")
            d.text((x0 - 50, y - 6), f"{v:.0f}", fill="black", font=font)
        group = pw / 3
        bw = group / 4
        for g, n in enumerate((1, 2, 4)):
            gx = x0 + g * group + bw / 2
            d.text((gx + bw, y1 + 8), f"{n} device{'s' if n > 1 else ''}", fill="black", font=font)
            for m, mode in enumerate(MODES):
                s = runs.get((mode, n))
                if s is None:
                    continue
                h = (y1 - y0) * value(s) / vmax
                bx = gx + m * bw
                d.rectangle([bx, y1 - h, bx + bw - 3, y1], fill=COLORS[mode])
                d.text((bx, y1 - h - 12), f"{value(s):.0f}", fill="black", font=font)
    for m, mode in enumerate(MODES):
        lx = pad + m * 120
        d.rectangle([lx, H - 30, lx + 14, H - 16], fill=COLORS[mode])
        d.text((lx + 20, H - 29), mode, fill="black", font=font)
    d.text((pad + 380, H - 29), f"Fashion-MNIST CNN, global batch 128, {kind.upper()}", fill="black", font=font)
    img.save(path)
    return True


def main():
    out, results, png, kind = sys.argv[1:5]
    runs = load(out)
    if ("single", 1) not in runs:
        sys.exit("report: the single-device baseline is missing")
    lines, worst = table(runs, kind)
    any_run = runs[("single", 1)]
    samples = any_run["samples"]
    ok = worst <= ACCURACY_TOLERANCE_PP
    has_chart = chart(runs, kind, png)
    cpu = platform.processor() or platform.machine()
    doc = [
        "# DP vs DDP vs single — results",
        "",
        f"Command: `bash bench/dp/run_dp_compare.sh` ({datetime.date.today().isoformat()}, {kind.upper()}, "
        f"{os.cpu_count()} CPU cores, {cpu}).",
        f"Every run trains the Fashion-MNIST CNN on the same {samples} samples in the same global batches of 128 "
        "(single: batch 128; dp: batch 128 split over the replicas; ddp: 128/N per process), SGD lr 0.05 momentum 0.9, "
        "then tests on all 10 000 test images.",
        "",
        *lines,
        "",
        f"Accuracy agreement: {'PASS' if ok else 'FAIL'} — largest deviation from single (1) is {worst:.2f} "
        f"percentage points (tolerance {ACCURACY_TOLERANCE_PP} pp: the modes compute the same batches, so only "
        "floating-point summation order differs).",
        "",
        "- samples/s: training samples per second of wall time over the whole loop (no evaluation).",
        f"- load before: the 1-minute load average when the run started; above {os.cpu_count()} (the core count) "
        "other work was competing for the cores and the timings of that run are pessimistic.",
        "- memory: CPU — peak resident set (VmHWM) of each process: one for single and dp (all replicas share it), "
        "one per rank for ddp; GPU — the caching allocator's peak allocated bytes per device.",
        "- main-device share: the first device's part of the total; for dp on GPUs this is the imbalance "
        "nn.DataParallel is known for (master weights, gathered outputs, loss and gradient reduction all live on GPU 0).",
    ]
    if has_chart:
        doc += ["", f"![DP vs DDP vs single]({os.path.basename(png)})"]
    with open(results, "w") as f:
        f.write("\n".join(doc) + "\n")
    print("\n".join(lines))
    print(f"accuracy agreement {'PASS' if ok else 'FAIL'} (max {worst:.2f} pp); wrote {results}"
          + (f" and {png}" if has_chart else ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
