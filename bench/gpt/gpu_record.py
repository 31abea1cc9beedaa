#!/usr/bin/env python3
"""One run of bench/gpt/run_gpu.sh as a JSON line: tokens/s (the median over the LOG-step windows
after SKIP steps), MFU, peak memory and the last loss; or "failed" with the log's last line.

    gpu_record.py SIDE VARIANT REP PATH RC SECONDS SKIP LOG BATCH BLOCK

SIDE ours: PATH is the worker's output.dir (metrics.jsonl, summary.json; PATH.log its output).
SIDE nanogpt: PATH is train.py's output, whose log lines the scratch copy ends with
", wall <time.time() after loss.item()>": a window's tokens/s = LOG * BATCH * BLOCK / (its wall
difference), for windows that start at iter >= SKIP; "peak_allocated_mb X" is its last line.
"""
import json, re, statistics, sys
side, variant, rep, path, rc, seconds, skip, log, batch, block = sys.argv[1:]
skip, log, batch, block = int(skip), int(log), int(batch), int(block)
r = {"bench": "gpt_gpu", "side": side, "variant": variant, "rep": int(rep), "wall_s": int(seconds)}
try:
    if rc != "0":
        raise RuntimeError(f"exit {rc}")
    if side == "ours":
        rows = [json.loads(l) for l in open(path + "/metrics.jsonl")]
        rows = [x for x in rows if "tokens_per_s" in x and x["step"] > skip]
        r["tokens_per_s"] = statistics.median(x["tokens_per_s"] for x in rows)
        mfus = [x["mfu"] for x in rows if "mfu" in x]
        if mfus:
            r["mfu"] = statistics.median(mfus)
        s = json.load(open(path + "/summary.json"))
        peak = s.get("cuda_peak_allocated_mb_per_device") or []
        r["peak_mb"] = peak[0] if peak else None
        r["final_loss"] = s.get("final_loss")
    else:
        text = open(path).read()
        marks = [(int(m.group(1)), float(m.group(2)), float(m.group(3)))
                 for m in re.finditer(r"iter (\d+): loss ([\d.]+), time [\d.]+ms, mfu [-\d.]+%, wall ([\d.]+)", text)]
        rates = [log * batch * block / (b[2] - a[2]) for a, b in zip(marks, marks[1:]) if a[0] >= skip and b[0] - a[0] == log]
        r["tokens_per_s"] = statistics.median(rates)
        r["final_loss"] = marks[-1][1]
        m = re.search(r"peak_allocated_mb ([-\d.]+)", text)
        r["peak_mb"] = float(m.group(1)) if m and float(m.group(1)) >= 0 else None
except Exception as e:  # noqa: BLE001 - the run's failure is the record
    lines = []
    try:
        lines = open(path if side != "ours" else path + ".log").read().strip().splitlines()
    except OSError:
        pass
    r["failed"] = f"{e}; last line: {lines[-1] if lines else '(none)'}"
print(json.dumps(r), flush=True)
