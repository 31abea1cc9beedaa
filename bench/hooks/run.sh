#!/usr/bin/env bash
# DDP communication hooks on the CPU (comm.hook): training samples/s of none, fp16, bf16 and PowerSGD
# (rank 1 and 2) for the Fashion-MNIST CNN, ours beside Python PyTorch DDP with the same hook registered
# through model.register_comm_hook (bench/whole_job/python_ddp_job.py, PY_JOB_HOOK), alternated in one
# run so both see the same machine, plus the gradient bytes each rank all-reduces per step. Figures are
# the training loop's own (samples / train_seconds on both sides), per-rank batch 64, NPROC ranks,
# STEPS optimizer steps, PowerSGD compressing from iteration PSGD_START. PowerSGD rows put the CNN in
# one bucket on both sides (ours comm.first_bucket_mb=25, Python bucket_cap_mb=25): PyTorch's
# powerSGD_hook dies on Gloo with two buckets. bf16 is skipped (and said so) if either side fails it.
# ACCURACY=1 adds one 1-epoch run of ours each with none and PowerSGD rank 2 (start 50), evaluated.
# Writes bench/hooks/RESULTS.md and raw_last.jsonl.
#   bash bench/hooks/run.sh                          # build/, 2 ranks over Gloo, 2 repeats, 200 steps
#   REPEATS=3 STEPS=300 ACCURACY=0 bash bench/hooks/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
repeats=${REPEATS:-2}
nproc=${NPROC:-2}
steps=${STEPS:-200}
backend=${BACKEND:-gloo}
psgd_start=${PSGD_START:-10}
accuracy=${ACCURACY:-1}
root=/usr/share/datasets/fashion-mnist
python=.venv/bin/python
torchrun=.venv/bin/torchrun
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
raw=bench/hooks/raw_last.jsonl
: >"$raw"
skipped=()

# name, ours' comm.* overrides, Python's environment
hooks=(none fp16 bf16 powersgd-r1 powersgd-r2)
ours_args() {
  case $1 in
    none | fp16 | bf16) echo "comm.hook=$1" ;;
    powersgd-r*) echo "comm.hook=powersgd comm.powersgd_rank=${1#powersgd-r} comm.powersgd_start_iter=$psgd_start comm.first_bucket_mb=25" ;;
  esac
}
py_env() {
  case $1 in
    none | fp16 | bf16) echo "PY_JOB_HOOK=$1" ;;
    powersgd-r*) echo "PY_JOB_HOOK=powersgd PY_JOB_PSGD_RANK=${1#powersgd-r} PY_JOB_PSGD_START=$psgd_start" ;;
  esac
}

run_ours() {  # run_ours HOOK: 0 ok, 1 failed (log shown)
  # shellcheck disable=SC2046
  "$build/ddp-launch" --nproc_per_node="$nproc" "$build/worker" configs/fmnist_cnn_ddp.yaml \
    backend="$backend" train.batch_size=64 train.max_steps="$steps" eval.enabled=false $(ours_args "$1") \
    output.dir="$scratch/ours" >"$scratch/ours.log" 2>&1 || { tail -n 20 "$scratch/ours.log"; return 1; }
}
run_python() {  # run_python HOOK
  # shellcheck disable=SC2046
  env $(py_env "$1") PY_JOB_OUT="$scratch/python" PY_JOB_BATCH=64 PY_JOB_MAX_STEPS="$steps" \
    OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc_per_node="$nproc" \
    bench/whole_job/python_ddp_job.py "$root" >"$scratch/python.log" 2>&1 || { tail -n 20 "$scratch/python.log"; return 1; }
}

for i in $(seq "$repeats"); do
  # Alternated: odd repeats run ours first, even ones Python first, so drift hits both sides alike.
  if (( i % 2 )); then sides=(ours python); else sides=(python ours); fi
  for hook in "${hooks[@]}"; do
    [[ " ${skipped[*]-} " == *" $hook "* ]] && continue
    failed=
    for side in "${sides[@]}"; do
      if ! "run_$side" "$hook"; then failed=$side; break; fi
    done
    if [[ -n $failed ]]; then
      [[ $hook == bf16 ]] || exit 1
      echo "bf16: $([[ $failed == ours ]] && echo ours || echo Python) failed; skipping it" >&2; skipped+=(bf16); continue
    fi
    "$python" - "$scratch/ours/summary.json" "$scratch/python.log" "$hook" "$i" "$nproc" "${sides[0]}" >>"$raw" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
py = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][-1]
samples = ours["samples"]  # the same steps × global batch on both sides
print(json.dumps({"run": "speed", "repeat": int(sys.argv[4]), "first": sys.argv[6], "hook": sys.argv[3], "ranks": int(sys.argv[5]),
                  "steps": ours["steps"], "python_steps": py["steps"],
                  "ours_samples_per_s": samples / ours["train_seconds"],
                  "python_samples_per_s": samples / py["train_seconds"],
                  "gradient_elements": ours["gradient_elements"],
                  "gradient_elements_sent": ours["gradient_elements_sent"],
                  "python_gradient_elements": py.get("gradient_elements", 0),
                  "python_gradient_elements_sent": py.get("gradient_elements_sent", 0)}))
PY
    tail -n 1 "$raw"
  done
done

if [[ $accuracy == 1 ]]; then
  for hook in none powersgd-r2; do
    args="comm.hook=none"
    [[ $hook == powersgd-r2 ]] && args="comm.hook=powersgd comm.powersgd_rank=2 comm.powersgd_start_iter=50"
    # shellcheck disable=SC2086
    "$build/ddp-launch" --nproc_per_node="$nproc" "$build/worker" configs/fmnist_cnn_ddp.yaml \
      backend="$backend" train.batch_size=64 $args output.dir="$scratch/acc" >"$scratch/acc.log" 2>&1 \
      || { tail -n 20 "$scratch/acc.log"; exit 1; }
    "$python" - "$scratch/acc/summary.json" "$hook" "$args" >>"$raw" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"run": "accuracy", "hook": sys.argv[2], "args": sys.argv[3], "ranks": s["world_size"],
                  "steps": s["steps"], "test_accuracy": s["test_accuracy"], "samples_per_s": s["samples_per_s"],
                  "gradient_elements": s["gradient_elements"], "gradient_elements_sent": s["gradient_elements_sent"]}))
PY
    tail -n 1 "$raw"
  done
fi

"$python" - "$raw" "$build" "$nproc" "$steps" "$backend" "$psgd_start" "${skipped[*]-}" >bench/hooks/RESULTS.md <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench/whole_job")
from python_ddp_job import Cnn  # the same layers as our "cnn"
raw, build, nproc, steps, backend, psgd_start, skipped = sys.argv[1:8]
rows = [json.loads(l) for l in open(raw)]
speed = [r for r in rows if r["run"] == "speed"]
params = sum(p.numel() for p in Cnn().parameters())
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print("# DDP communication hooks on the CPU: ours vs Python DDP\n")
print(f"`bash bench/hooks/run.sh` ({build}/, {nproc} ranks, ours over {backend}, Python DDP over gloo, "
      f"Fashion-MNIST CNN ({params} parameters), per-rank batch 64, {steps} steps, PowerSGD compressing from "
      f"iteration {psgd_start}), on {cpu}, {len(set(r['repeat'] for r in speed))} alternated repeats (odd ones ours "
      "first, even ones Python first), medians; ours / Python is the median of the per-repeat ratios (both sides "
      "from the same repeat, back to back), min–max in brackets. "
      "Python: the pinned wheel's DistributedDataParallel with model.register_comm_hook "
      "(default_hooks.fp16_compress_hook / bf16_compress_hook, powerSGD_hook with PowerSGDState). "
      "Training loop only (no start-up, no evaluation): samples / train_seconds.\n")
print("| hook | ours samples/s | Python samples/s | ours / Python | vs our none | bytes / step / rank | vs none |")
print("|---|---|---|---|---|---|---|")
base = None
notes = []
for hook in ("none", "fp16", "bf16", "powersgd-r1", "powersgd-r2"):
    sel = [r for r in speed if r["hook"] == hook]
    if not sel:
        continue
    o = statistics.median(r["ours_samples_per_s"] for r in sel)
    p = statistics.median(r["python_samples_per_s"] for r in sel)
    base = base or o
    r = sel[0]
    if hook == "none":
        b = 4 * params
    elif hook in ("fp16", "bf16"):
        b = 2 * params
    else:
        compressed = r["gradient_elements"] / params  # PowerSGD iterations
        plain = r["steps"] - compressed
        b = (4 * r["gradient_elements_sent"] + 4 * params * plain) / r["steps"]
        notes.append(f"{hook}: {compressed:g} compressed + {plain:g} plain iterations; "
                     f"{r['gradient_elements_sent'] / compressed:.0f} elements = "
                     f"{4 * r['gradient_elements_sent'] / compressed:,.0f} bytes sent per compressed iteration, "
                     f"{params * compressed / r['gradient_elements_sent']:.0f}x less than none "
                     f"(ours {r['gradient_elements_sent']}, Python {r['python_gradient_elements_sent']} in all)")
    less = "1.0x" if hook == "none" else f"{4 * params / b:.1f}x less"
    paired = [x["ours_samples_per_s"] / x["python_samples_per_s"] for x in sel]
    print(f"| {hook} | {o:.0f} | {p:.0f} | {statistics.median(paired):.2f}x ({min(paired):.2f}–{max(paired):.2f}) | "
          f"{o / base:.2f}x | {b:,.0f} | {less} |")
print("\nBytes / step / rank: the gradient payload each rank all-reduces per optimizer step, averaged over the "
      f"{steps} steps (not counting the all-reduce algorithm's own traffic, which is 2(N-1)/N x the payload for "
      f"a ring: 1x at 2 ranks). none: 4 x {params} parameters; fp16/bf16: 2 x parameters; PowerSGD: "
      "(4 x gradient_elements_sent (our summary: PowerSGD's compression_stats over the compressed "
      "iterations, P and Q factors plus the tensors it leaves uncompressed) + 4 x parameters x the "
      "plain all-reduce iterations before start_powerSGD_iter) / steps; the compressed iterations are "
      "gradient_elements / parameters.")
for n in notes:
    print(f"- {n}")
if skipped:
    print(f"\nSkipped: {skipped} (failed on one side; see the run's output).")
acc = [r for r in rows if r["run"] == "accuracy"]
if acc:
    print("\n## Accuracy, one epoch (ours)\n")
    print(f"`{build}/ddp-launch --nproc_per_node={nproc} {build}/worker configs/fmnist_cnn_ddp.yaml "
          f"backend={backend} train.batch_size=64 ARGS` (eval enabled, whole test set). Target: >= 87% for "
          "PowerSGD rank 2.\n")
    print("| hook | ARGS | steps | test accuracy | samples/s |")
    print("|---|---|---|---|---|")
    for r in acc:
        print(f"| {r['hook']} | `{r['args']}` | {r['steps']} | {100 * r['test_accuracy']:.2f}% | {r['samples_per_s']:.0f} |")
PY
cat bench/hooks/RESULTS.md
