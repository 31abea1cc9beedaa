#!/usr/bin/env bash
# One command for the DDP engine benchmarks: ours vs PyTorch DDP, overlap,
# collectives, scaling. Prints a table and writes bench/RESULTS_ddp.md (its raw lines:
# bench/raw_ddp_last.jsonl).
#   bash bench/run_ddp_bench.sh            (BUILD=build dir, REPS=repetitions)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPS=${REPS:-3}
PY=${PY:-$PWD/.venv/bin/python}  # the reference PyTorch 2.x (scripts/setup.sh)
export OMP_NUM_THREADS=1
cmake --build "$BUILD" -j2 --target worker ddp-launch ddp_bench >/dev/null
OUT=$(mktemp -d /tmp/ddp_bench_XXXXXX)
RAW=$OUT/raw.jsonl
libtorch=$(cat "$BUILD/libtorch_version.txt")  # written by cmake/Dependencies.cmake
echo "{\"bench\":\"versions\",\"libtorch\":\"$libtorch\",\"pytorch\":\"$($PY -c 'import torch;print(torch.__version__)')\"}" >>"$RAW"
LAUNCH="$BUILD/ddp-launch"

# ours: the real worker on synthetic in-memory data; the rate of the window after WARM steps.
ours() {  # world model hidden batch warm
  local dir=$OUT/run_$RANDOM
  "$LAUNCH" --nproc_per_node="$1" "$BUILD/worker" configs/synthetic_mlp.yaml \
    model.name="$2" "model.hidden=[$3]" train.batch_size="$4" train.max_steps=$((2 * $5)) \
    train.log_every="$5" train.epochs=1000 eval.enabled=false data.synthetic_train=8192 \
    output.dir="$dir" >/dev/null 2>&1
  tail -1 "$dir/metrics.jsonl" | $PY -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])'
}
theirs() {  # world model hidden batch warm
  "$LAUNCH" --nproc_per_node="$1" $PY bench/ddp_reference.py "$2" "$3" "$4" "$5" "$5" 2>/dev/null |
    grep samples_per_s | sed 's/^\[rank 0\] //' | $PY -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])'
}

for world in 2 4; do
  for spec in "mlp 512,256 64 40 MLP-784-512-256-10" "cnn 512,256 64 10 CNN" "mlp 4096,4096 64 4 MLP-784-4096-4096-10(20M)"; do
    set -- $spec
    for rep in $(seq "$REPS"); do  # alternated: the side that runs first swaps every repetition
      if (( rep % 2 )); then
        o=$(ours "$world" "$1" "$2" "$3" "$4"); t=$(theirs "$world" "$1" "$2" "$3" "$4"); first=ours
      else
        t=$(theirs "$world" "$1" "$2" "$3" "$4"); o=$(ours "$world" "$1" "$2" "$3" "$4"); first=pytorch
      fi
      echo "{\"bench\":\"vs_pytorch\",\"model\":\"$5\",\"world\":$world,\"rep\":$rep,\"first\":\"$first\",\"ours\":$o,\"pytorch\":$t}" | tee -a "$RAW"
    done
  done
done
for backend in gloo shm; do
  export DDP_BENCH_BACKEND=$backend
  "$LAUNCH" --nproc_per_node=2 "$BUILD/bench/ddp_bench" overlap 4096,4096 64 5 2>/dev/null | sed 's/^\[rank 0\] //' | tee -a "$RAW"
  "$LAUNCH" --nproc_per_node=2 "$BUILD/bench/ddp_bench" overlap 512,256 64 40 2>/dev/null | sed 's/^\[rank 0\] //' | tee -a "$RAW"
  for world in 2 4; do
    "$LAUNCH" --nproc_per_node=$world "$BUILD/bench/ddp_bench" collectives 2>/dev/null | sed 's/^\[rank 0\] //' | tee -a "$RAW"
  done
done
unset DDP_BENCH_BACKEND
for world in 1 2 4; do
  for rep in $(seq "$REPS"); do
    echo "{\"bench\":\"scaling\",\"world\":$world,\"samples_per_s\":$(ours "$world" mlp 512,256 64 40)}" | tee -a "$RAW"
  done
done
$PY bench/ddp_report.py "$RAW" bench/RESULTS_ddp.md
cp "$RAW" bench/raw_ddp_last.jsonl  # the figures behind the report, kept beside it
cat bench/RESULTS_ddp.md
