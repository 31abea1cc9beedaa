#!/usr/bin/env python3
"""Where a training step's time goes, from a Chrome trace of torch.profiler / Kineto: ours
(`output.profile_start`, output.dir/profile_rank0.json) and Python's (python_gpu_reference.py
--profile PATH) read alike, so the two sides can be set side by side.

    python3 bench/gpu/trace_summary.py ours=out/profile_rank0.json python=py_trace.json [--top 12]

Per trace, over the ProfilerStep#k spans: the step's mean wall time; the ops dispatched per step
(cpu_op events, all and top-level: what the host pays for); CUDA runtime calls per step (kernel
launches, memcpys, event and stream calls) and their host time; GPU kernels per step and their
device time; then the top-level ops with the most host time per step. One JSON line per trace
follows the tables (for RESULTS files).
"""
import argparse
import collections
import json
import sys

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


def load(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]


def within(e, spans):
    t = float(e["ts"])
    return any(s <= t < s + d for s, d in spans)


def summarize(name, path, top):
    events = load(path)
    # One span per step: Kineto also copies a ProfilerStep#k span onto each GPU stream that ran in
    # it (cat gpu_user_annotation); only the host's span (cat user_annotation) is the step.
    host_steps = {}
    for e in events:
        span = str(e.get("name", ""))
        if span.startswith("ProfilerStep#") and not str(e.get("cat", "")).startswith("gpu_"):
            if span not in host_steps or e.get("cat") == "user_annotation":
                host_steps[span] = e
    steps = sorted(host_steps.values(), key=lambda e: float(e["ts"]))
    if not steps:
        raise SystemExit(f"{path}: no ProfilerStep#k spans (profile with output.profile_start or prof.step())")
    spans = [(float(e["ts"]), float(e["dur"])) for e in steps]
    n = len(steps)
    host_pid = steps[0].get("pid")
    host_tid = steps[0].get("tid")
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op" and within(e, spans)]
    # Top-level: not inside another cpu_op of the same thread.
    by_thread = collections.defaultdict(list)
    for e in cpu_ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    top_level = []
    for ops in by_thread.values():
        ops.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        end = -1.0
        for e in ops:
            if float(e["ts"]) >= end:
                top_level.append(e)
                end = float(e["ts"]) + float(e["dur"])
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and within(e, spans)]
    launches = [e for e in runtime if e.get("name") in LAUNCHES]
    # GPU work runs later than its launch: take the kernels whose correlated launch is in a step.
    launched = {e.get("args", {}).get("correlation") for e in runtime}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and e.get("args", {}).get("correlation") in launched]
    per_name = collections.defaultdict(lambda: [0, 0.0])
    for e in top_level:
        if e.get("pid") == host_pid and e.get("tid") == host_tid:
            per_name[e["name"]][0] += 1
            per_name[e["name"]][1] += float(e["dur"])
    row = {
        "side": name, "trace": path, "steps": n,
        "step_us": round(sum(d for _, d in spans) / n, 1),
        "cpu_ops_per_step": round(len(cpu_ops) / n, 1),
        "top_level_ops_per_step": round(len(top_level) / n, 1),
        "cuda_runtime_calls_per_step": round(len(runtime) / n, 1),
        "cuda_runtime_us_per_step": round(sum(float(e["dur"]) for e in runtime) / n, 1),
        "kernel_launches_per_step": round(len(launches) / n, 1),
        "gpu_ops_per_step": round(len(kernels) / n, 1),
        "gpu_busy_us_per_step": round(sum(float(e["dur"]) for e in kernels) / n, 1),
    }
    hot = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:top]
    row["top_ops"] = [{"name": k, "calls_per_step": round(c / n, 2), "host_us_per_step": round(t / n, 1)}
                      for k, (c, t) in hot]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="NAME=PATH, e.g. ours=out/profile_rank0.json")
    p.add_argument("--top", type=int, default=12, help="top-level ops listed per trace")
    args = p.parse_args(argv)
    rows = []
    for spec in args.traces:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = spec, spec
        rows.append(summarize(name, path, args.top))
    keys = ["steps", "step_us", "cpu_ops_per_step", "top_level_ops_per_step", "cuda_runtime_calls_per_step",
            "cuda_runtime_us_per_step", "kernel_launches_per_step", "gpu_ops_per_step", "gpu_busy_us_per_step"]
    print("| per step | " + " | ".join(r["side"] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k in keys:
        print(f"| {k} | " + " | ".join(str(r[k]) for r in rows) + " |")
    for r in rows:
        print(f"\n{r['side']}: top-level ops by host time per step")
        print("| op | calls/step | host µs/step |")
        print("|---|---|---|")
        for op in r["top_ops"]:
            print(f"| {op['name']} | {op['calls_per_step']} | {op['host_us_per_step']} |")
    print()
    for r in rows:
        print(json.dumps({"bench": "trace_summary", **r}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
