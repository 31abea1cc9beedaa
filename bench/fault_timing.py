#!/usr/bin/python3
"""How long ddp-launch takes to notice a killed rank and stop the job.

usage: bench/fault_timing.py BUILD_DIR [REPS]
For 2 and 4 ranks: start a long synthetic run, SIGKILL rank 1 at step 20, and
time (a) kill -> the launcher's failure line (detection) and (b) kill -> the
launcher's exit with every worker reaped (shutdown). Prints a markdown table.
"""
import os
import signal
import statistics
import subprocess
import sys
import time

build = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return sorted(out)


def once(world):
    cmd = [f"{build}/ddp-launch", f"--nproc_per_node={world}", f"{build}/worker",
           f"{root}/configs/synthetic_mlp.yaml", "train.epochs=100000", "train.log_every=1",
           "output.dir=/tmp/ddp_fault_timing"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in p.stdout:
        if " step 20/" in line:
            break
    victim = children(p.pid)[1]
    t0 = time.perf_counter()
    os.kill(victim, signal.SIGKILL)
    detected = None
    for line in p.stdout:
        if detected is None and "ddp-launch: rank" in line and ("failed" in line or "killed" in line):
            detected = time.perf_counter() - t0
    p.wait()
    return detected, time.perf_counter() - t0


print("| ranks | detection (kill -> failure line) | shutdown (kill -> launcher exit, all reaped) |")
print("|---|---|---|")
for world in (2, 4):
    runs = [once(world) for _ in range(reps)]
    d = statistics.median(r[0] for r in runs)
    s = statistics.median(r[1] for r in runs)
    print(f"| {world} | {d * 1000:.0f} ms | {s * 1000:.0f} ms |")
