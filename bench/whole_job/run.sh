#!/usr/bin/env bash
# The whole of README's command 1, ours beside Python PyTorch DDP doing the same job
# (python_ddp_job.py), alternated in one run so both see the same machine, REPEATS times each.
# Wall time from launch to exit, start-up, data loading, training, evaluation and export included.
# Writes bench/whole_job/RESULTS.md and raw_last.jsonl.
#   bash bench/whole_job/run.sh            # build/ (LibTorch 2.x, the pinned wheel's), 3 repeats
#   REPEATS=5 BUILD=build-debian bash bench/whole_job/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
repeats=${REPEATS:-3}
nproc=${NPROC:-4}
root=/usr/share/datasets/fashion-mnist
python=.venv/bin/python
torchrun=.venv/bin/torchrun
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
raw=bench/whole_job/raw_last.jsonl
: >"$raw"

now() { date +%s.%N; }
run_ours() {
  ours_t0=$(now)
  "$build/ddp-launch" --nproc_per_node="$nproc" "$build/worker" configs/fmnist_cnn_ddp.yaml \
    output.dir="$scratch/ours" >"$scratch/ours.log" 2>&1
  ours_t1=$(now)
}
run_python() {
  python_t0=$(now)
  PY_JOB_OUT="$scratch/python" OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc_per_node="$nproc" \
    bench/whole_job/python_ddp_job.py "$root" >"$scratch/python.log" 2>&1
  python_t1=$(now)
}
for i in $(seq "$repeats"); do
  # Alternated: odd repeats run ours first, even ones Python first, so drift hits both sides alike.
  if (( i % 2 )); then run_ours; run_python; first=ours; else run_python; run_ours; first=python; fi
  "$python" - "$scratch/ours/summary.json" "$scratch/python.log" "$ours_t0" "$ours_t1" "$python_t0" "$python_t1" \
    "$i" "$first" >>"$raw" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
py = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][-1]
o0, o1, p0, p1 = map(float, sys.argv[3:7])
print(json.dumps({"repeat": int(sys.argv[7]), "first": sys.argv[8],
                  "ours": {"wall_s": o1 - o0, "train_s": ours["train_seconds"], "eval_s": ours["eval_seconds"],
                           "steps": ours["steps"], "test_accuracy": ours["test_accuracy"]},
                  "python": {"wall_s": p1 - p0, "train_s": py["train_seconds"], "eval_s": py["eval_seconds"],
                             "steps": py["steps"], "test_accuracy": py["test_accuracy"]}}))
PY
  tail -n 1 "$raw"
done

# Start-up (issue 13 item 3): launcher start to rank 0's line for step 1 (logged after the step).
"$python" - "$build" "$nproc" "$scratch" "$repeats" >"$scratch/startup.json" <<'PY'
import json, subprocess, sys, time
build, nproc, scratch, repeats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
seconds = []
for i in range(repeats):
    start = time.perf_counter()
    job = subprocess.Popen([f"{build}/ddp-launch", f"--nproc_per_node={nproc}", f"{build}/worker",
                            "configs/fmnist_cnn_ddp.yaml", f"output.dir={scratch}/startup",
                            "train.max_steps=2", "eval.enabled=false"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    for line in job.stdout:
        if first is None and " step 1/" in line:
            first = time.perf_counter() - start
    if job.wait() != 0 or first is None:
        sys.exit("start-up run failed")
    seconds.append(first)
print(json.dumps(seconds))
PY

"$python" - "$raw" "$build" "$nproc" "$scratch/startup.json" <<'PY' >bench/whole_job/RESULTS.md
import json, statistics, sys, subprocess, platform
rows = [json.loads(l) for l in open(sys.argv[1])]
build, nproc = sys.argv[2], sys.argv[3]
med = lambda side, key: statistics.median(r[side][key] for r in rows)
paired = [r["python"]["wall_s"] / r["ours"]["wall_s"] for r in rows]  # both sides of one repeat
ratio = statistics.median(paired)
torch_version = subprocess.run([".venv/bin/python", "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True).stdout.strip()
print("# Whole job: README command 1 vs Python PyTorch DDP doing the same job\n")
print(f"`bash bench/whole_job/run.sh` ({build}, {nproc} ranks, {len(rows)} alternated repeats (odd ones ours first, "
      "even ones Python first), "
      f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores; Python torch {torch_version}). "
      "Medians; wall = launch to exit (start-up, data, training, evaluation of the 10 000 test images "
      "sharded in batches of 100, export).\n")
print("| | wall s | train s | eval s | steps | test accuracy |")
print("|---|---|---|---|---|---|")
for side, name in (("ours", "ddp-launch + worker"), ("python", "torchrun + Python DDP")):
    print(f"| {name} | {med(side, 'wall_s'):.2f} | {med(side, 'train_s'):.2f} | {med(side, 'eval_s'):.2f} | "
          f"{rows[0][side]['steps']} | {med(side, 'test_accuracy'):.4f} |")
print(f"\n**Python wall / ours: {ratio:.2f}×** (the median of the per-repeat ratios; target ≥ 1.6×). Per repeat: "
      + ", ".join(f"{x:.2f}" for x in paired) + ".")
startup = json.load(open(sys.argv[4]))
print(f"\nStart-up, ddp-launch start to the end of rank 0's first training step ({nproc} ranks, "
      f"`train.max_steps=2 eval.enabled=false`): median **{statistics.median(startup):.2f} s** "
      f"(target ≤ 1.5 s); runs: " + ", ".join(f"{s:.2f}" for s in startup) + ".")
PY
cat bench/whole_job/RESULTS.md
