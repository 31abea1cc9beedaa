#!/usr/bin/env bash
# What the always-on flight recorder costs (issue 28's target: < 1 us per collective, no measurable
# slowdown of the CPU CNN/MLP jobs):
#  1. per collective: Recorder::begin + end on 1 and 2 threads (flight_recorder_bench);
#  2. whole jobs: the Fashion-MNIST CNN and MLP, NPROC ranks over BACKEND, STEPS steps, the recorder
#     on and off (DDP_FLIGHT_RECORDER=0) alternated REPEATS times in one run, so both see the same
#     machine; training samples/s from summary.json and the ratio on/off.
# Writes bench/flight_recorder/RESULTS.md and raw_last.jsonl.
#   bash bench/flight_recorder/run.sh
#   REPEATS=5 STEPS=400 BACKEND=shm bash bench/flight_recorder/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
repeats=${REPEATS:-3}
nproc=${NPROC:-2}
steps=${STEPS:-300}
backend=${BACKEND:-gloo}
python=.venv/bin/python
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
raw=bench/flight_recorder/raw_last.jsonl
: >"$raw"

cmake --build "$build" --target flight_recorder_bench worker ddp-launch >/dev/null
"$build/bench/flight_recorder_bench" | sed 's/^{/{"run": "micro", /' >>"$raw"
cat "$raw"

for i in $(seq "$repeats"); do
  # Alternated: odd repeats run the recorder on first, even ones off first, so drift hits both alike.
  if (( i % 2 )); then order=(on off); else order=(off on); fi
  for model in cnn mlp; do
    for recorder in "${order[@]}"; do
      flag=1
      [[ $recorder == off ]] && flag=0
      DDP_FLIGHT_RECORDER=$flag "$build/ddp-launch" --nproc_per_node="$nproc" "$build/worker" \
        "configs/fmnist_${model}_ddp.yaml" backend="$backend" train.max_steps="$steps" eval.enabled=false \
        output.dir="$scratch/out" >"$scratch/log" 2>&1 || { tail -n 20 "$scratch/log"; exit 1; }
      "$python" - "$scratch/out/summary.json" "$model" "$recorder" "$i" "${order[0]}" >>"$raw" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"run": "job", "model": sys.argv[2], "recorder": sys.argv[3], "repeat": int(sys.argv[4]),
                  "first": sys.argv[5],
                  "steps": s["steps"], "samples_per_s": s["samples"] / s["train_seconds"]}))
PY
      tail -n 1 "$raw"
    done
  done
done

"$python" - "$raw" "$nproc" "$backend" "$steps" "$repeats" >bench/flight_recorder/RESULTS.md <<'PY'
import json, statistics, sys, platform, os
rows = [json.loads(l) for l in open(sys.argv[1])]
nproc, backend, steps, repeats = sys.argv[2:6]
print("# Flight recorder: cost per collective and whole-job samples/s, on vs off\n")
print(f"`bash bench/flight_recorder/run.sh` ({platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
      f"jobs: {nproc} ranks over {backend}, {steps} steps, {repeats} alternated repeats (odd ones recorder on "
      "first, even ones off first); medians; on / off is the median of the per-repeat ratios (both runs from the "
      "same repeat, back to back), min–max in brackets)\n")
print("| recorder calls on | ns per collective (begin + end) |\n|---|---|")
for r in rows:
    if r["run"] == "micro":
        print(f"| {r['threads']} thread(s) | {r['ns_per_collective']:.1f} |")
print("\n| model | samples/s, recorder on | off (`DDP_FLIGHT_RECORDER=0`) | on / off |\n|---|---|---|---|")
for model in ("cnn", "mlp"):
    jobs = [r for r in rows if r["run"] == "job" and r["model"] == model]
    on = {r["repeat"]: r["samples_per_s"] for r in jobs if r["recorder"] == "on"}
    off = {r["repeat"]: r["samples_per_s"] for r in jobs if r["recorder"] == "off"}
    paired = [on[i] / off[i] for i in sorted(on) if i in off]
    if paired:
        a, b = statistics.median(on.values()), statistics.median(off.values())
        print(f"| {model} | {a:.0f} | {b:.0f} | {statistics.median(paired):.3f} "
              f"({min(paired):.3f}–{max(paired):.3f}) |")
print("\nEach run's figures are in `raw_last.jsonl`. This machine is noisy: a ratio within a few per cent of 1 is "
      "no measurable difference.")
PY
cat bench/flight_recorder/RESULTS.md
