#!/usr/bin/env bash
# The host's cost per training step, ours vs PyTorch DDP, where the kernels cost next to nothing:
# world 1 over Gloo with the DDP reducer on (comm.ddp_on_one_rank, as Python's DDP at world 1), an
# MLP 784-16-10 at batch 1, SGD(lr 0.001, momentum 0.9), synthetic in-memory data. What is left
# per step is the framework: dispatch, autograd, the reducer, the optimizer, the loop. On a GPU
# every one of those ops is a kernel launch the host pays for, so this is the part of a small
# model's GPU step that our C++ loop can win (bench/gpu/ measures the GPU step itself).
#   bash bench/host_overhead.sh        (BUILD=build, REPS=3, STEPS=3000: the window after as many)
# Prints a markdown table (µs per step; sides alternate) and writes bench/RESULTS_host_overhead.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPS=${REPS:-3}
STEPS=${STEPS:-3000}
PY=${PY:-$PWD/.venv/bin/python}
export OMP_NUM_THREADS=1
cmake --build "$BUILD" -j2 --target worker ddp-launch >/dev/null
OUT=$(mktemp -d /tmp/host_overhead_XXXXXX)
us_of() { "$PY" -c 'import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(round(1e6 / r["samples_per_s"], 1))'; }

ours() {  # train.fused value
  local dir=$OUT/ours_$1_$RANDOM
  "$BUILD/ddp-launch" --nproc_per_node=1 "$BUILD/worker" configs/synthetic_mlp.yaml backend=gloo model.name=mlp \
    "model.hidden=[16]" train.batch_size=1 train.lr=0.001 train.max_steps=$((2 * STEPS)) train.log_every="$STEPS" \
    train.epochs=1000 eval.enabled=false data.synthetic_train=8192 comm.ddp_on_one_rank=true train.fused="$1" \
    output.dir="$dir" >"$dir.log" 2>&1 || { tail -3 "$dir.log" >&2; echo nan; return; }
  tail -1 "$dir/metrics.jsonl" | us_of
}
theirs() {
  "$BUILD/ddp-launch" --nproc_per_node=1 "$PY" bench/ddp_reference.py mlp 16 1 "$STEPS" "$STEPS" 2>/dev/null |
    grep samples_per_s | sed 's/^\[rank 0\] //' | us_of
}

declare -a F T P
for rep in $(seq "$REPS"); do  # alternated: odd repetitions run ours first, even ones PyTorch first
  if (( rep % 2 )); then
    f=$(ours true); t=$(ours false); p=$(theirs)
  else
    p=$(theirs); t=$(ours false); f=$(ours true)
  fi
  F+=("$f"); T+=("$t"); P+=("$p")
done
libtorch=$(cat "$BUILD/libtorch_version.txt" 2>/dev/null || echo "?")
pytorch=$("$PY" -c 'import torch; print(torch.__version__)')
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
mf=$(median "${F[@]}"); mt=$(median "${T[@]}"); mp=$(median "${P[@]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# PyTorch / side per repetition (both from the same repetition), then their median and range.
paired() {  # paired SIDE_ARRAY_NAME: "median (min–max)" of P[i] / SIDE[i]
  local -n side=$1
  local -a r=()
  for ((i = 0; i < ${#P[@]}; i++)); do r+=("$(ratio "${P[$i]}" "${side[$i]}")"); done
  echo "$(printf '%.2f' "$(median "${r[@]}")")× ($(printf '%s\n' "${r[@]}" | sort -g | head -1)–$(printf '%s\n' "${r[@]}" | sort -g | tail -1))"
}
{
  echo "# Host cost per step: ours vs PyTorch DDP (last run)"
  echo
  echo "\`bash bench/host_overhead.sh\` on $(hostname) ($(getconf _NPROCESSORS_ONLN) cores), $(date -u +%Y-%m-%d): ours on LibTorch $libtorch,"
  echo "PyTorch $pytorch. World 1 over Gloo, DDP reducer on, MLP 784-16-10, batch 1, SGD(0.001, momentum 0.9),"
  echo "OMP_NUM_THREADS=1; µs per step over steps $((STEPS + 1))..$((2 * STEPS)); $REPS alternated repetitions"
  echo "(odd ones ours first, even ones PyTorch first). PyTorch / side: the median of the per-repetition ratios"
  echo "(both sides from the same repetition), min–max in brackets."
  echo
  echo "| side | µs per step (each repetition) | median | PyTorch / side |"
  echo "|---|---|---|---|"
  echo "| ours, \`train.fused=true\` (ddp::FusedSGD) | ${F[*]} | $mf | $(paired F) |"
  echo "| ours, \`train.fused=false\` (LibTorch SGD) | ${T[*]} | $mt | $(paired T) |"
  echo "| PyTorch DDP (\`bench/ddp_reference.py\`) | ${P[*]} | $mp | 1.00× |"
} | tee bench/RESULTS_host_overhead.md
