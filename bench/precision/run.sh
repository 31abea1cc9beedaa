#!/usr/bin/env bash
# Mixed precision on the CPU (issue 24, item 7): training samples/s of fp32, bf16 and fp16 for the
# Fashion-MNIST CNN and MLP, ours (train.precision) beside Python PyTorch DDP with torch.autocast +
# torch.amp.GradScaler doing the same job (bench/whole_job/python_ddp_job.py), alternated in one run
# so both see the same machine. Figures are the training loop's own (summary train_seconds; Python:
# the same loop timed the same way), per-rank batch 64, NPROC ranks over Gloo (ours: BACKEND, default
# gloo), STEPS optimizer steps (fp16 fewer: LibTorch's CPU float16 kernels are slow). Writes
# bench/precision/RESULTS.md and raw_last.jsonl.
#   bash bench/precision/run.sh                 # build/ (LibTorch 2.x), 2 ranks, 2 repeats
#   REPEATS=3 STEPS=300 bash bench/precision/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
repeats=${REPEATS:-2}
nproc=${NPROC:-2}
steps=${STEPS:-200}
fp16_steps=${FP16_STEPS:-10}
backend=${BACKEND:-gloo}  # ours over Gloo like Python DDP (the config's backend auto would pick shm)
root=/usr/share/datasets/fashion-mnist
python=.venv/bin/python
torchrun=.venv/bin/torchrun
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
raw=bench/precision/raw_last.jsonl
: >"$raw"

for i in $(seq "$repeats"); do
  for model in cnn mlp; do
    for precision in fp32 bf16 fp16; do
      n=$steps
      [[ $precision == fp16 ]] && n=$fp16_steps
      hidden=()
      [[ $model == mlp ]] && hidden=("model.hidden=[512, 256]")
      # Alternated: odd repeats run ours first, even ones Python first, so drift hits both sides alike.
      if (( i % 2 )); then sides=(ours python); else sides=(python ours); fi
      for side in "${sides[@]}"; do
        if [[ $side == ours ]]; then
          "$build/ddp-launch" --nproc_per_node="$nproc" "$build/worker" configs/fmnist_cnn_ddp.yaml \
            backend="$backend" model.name="$model" "${hidden[@]}" train.batch_size=64 train.max_steps="$n" \
            train.precision="$precision" eval.enabled=false output.dir="$scratch/ours" >"$scratch/ours.log" 2>&1 ||
            { cat "$scratch/ours.log"; exit 1; }
        else
          PY_JOB_OUT="$scratch/python" PY_JOB_MODEL=$model PY_JOB_PRECISION=$precision PY_JOB_BATCH=64 \
            PY_JOB_MAX_STEPS=$n OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc_per_node="$nproc" \
            bench/whole_job/python_ddp_job.py "$root" >"$scratch/python.log" 2>&1 || { cat "$scratch/python.log"; exit 1; }
        fi
      done
      "$python" - "$scratch/ours/summary.json" "$scratch/python.log" "$model" "$precision" "$i" "$nproc" "${sides[0]}" \
        >>"$raw" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
py = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][-1]
samples = ours["samples"]  # the same steps × global batch on both sides
print(json.dumps({"repeat": int(sys.argv[5]), "first": sys.argv[7], "model": sys.argv[3], "precision": sys.argv[4],
                  "ranks": int(sys.argv[6]), "steps": ours["steps"], "python_steps": py["steps"],
                  "ours_samples_per_s": samples / ours["train_seconds"],
                  "python_samples_per_s": samples / py["train_seconds"]}))
PY
      tail -n 1 "$raw"
    done
  done
done

"$python" - "$raw" "$build" "$nproc" "$steps" "$fp16_steps" "$backend" >bench/precision/RESULTS.md <<'PY'
import json, statistics, subprocess, sys
raw, build, nproc, steps, fp16_steps, backend = sys.argv[1:7]
rows = [json.loads(l) for l in open(raw)]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print("# Mixed precision on the CPU: fp32 vs bf16 vs fp16, ours vs Python DDP\n")
print(f"`bash bench/precision/run.sh` ({build}/, {nproc} ranks, ours over {backend}, Python over Gloo, per-rank "
      f"batch 64, {steps} steps; fp16 {fp16_steps} steps), on {cpu}, {len(set(r['repeat'] for r in rows))} "
      "alternated repeats (odd ones ours first, even ones Python first), medians; ours / Python is the median of "
      "the per-repeat ratios (both sides from the same repeat, back to back), min–max in brackets. "
      "Python: torch.autocast('cpu') + torch.amp.GradScaler (fp16) under DistributedDataParallel, the pinned wheel. "
      "Training loop only (no start-up, no evaluation).\n")
print("| model | precision | ours samples/s | Python samples/s | ours / Python | vs our fp32 |")
print("|---|---|---|---|---|---|")
med = {}
for model in ("cnn", "mlp"):
    for precision in ("fp32", "bf16", "fp16"):
        sel = [r for r in rows if r["model"] == model and r["precision"] == precision]
        if not sel:
            continue
        o = statistics.median(r["ours_samples_per_s"] for r in sel)
        p = statistics.median(r["python_samples_per_s"] for r in sel)
        med[(model, precision)] = o
        base = med.get((model, "fp32"), o)
        paired = [r["ours_samples_per_s"] / r["python_samples_per_s"] for r in sel]
        print(f"| {model} | {precision} | {o:.0f} | {p:.0f} | {statistics.median(paired):.2f}x "
              f"({min(paired):.2f}–{max(paired):.2f}) | {o / base:.2f}x |")
PY
cat bench/precision/RESULTS.md
