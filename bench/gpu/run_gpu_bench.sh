#!/usr/bin/env bash
# Ours vs PyTorch DDP on one GPU (NCCL, world 1), same model, per-rank batch and
# synthetic host-memory data; repetitions alternated. Prints JSON lines.
#   BUILD=build PY=python3 REPS=3 bash bench/gpu/run_gpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
REPS=${REPS:-3}
PY=${PY:-$PWD/.venv/bin/python}
LAUNCH="$BUILD/ddp-launch"
OUT=$(mktemp -d /tmp/ddp_gpu_bench_XXXXXX)

ours() {  # model hidden batch warm
  local dir=$OUT/run_$RANDOM
  "$LAUNCH" --nproc_per_node=1 "$BUILD/worker" configs/synthetic_mlp.yaml device=cuda backend=nccl \
    model.name="$1" "model.hidden=[$2]" train.batch_size="$3" train.max_steps=$((2 * $4)) \
    train.log_every="$4" train.epochs=1000 eval.enabled=false data.synthetic_train=8192 \
    output.dir="$dir" >"$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
  tail -1 "$dir/metrics.jsonl" | $PY -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])'
}
theirs() {  # model hidden batch warm
  DDP_BENCH_DEVICE=cuda "$LAUNCH" --nproc_per_node=1 $PY bench/ddp_reference.py "$1" "$2" "$3" "$4" "$4" 2>/dev/null |
    grep samples_per_s | sed 's/^\[rank 0\] //' | $PY -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])'
}

for spec in "mlp 512,256 64 200 MLP-784-512-256-10" "cnn 512,256 64 200 CNN" "cnn 512,256 512 100 CNN-b512" \
            "mlp 4096,4096 256 100 MLP-784-4096-4096-10(20M)"; do
  set -- $spec
  for rep in $(seq "$REPS"); do
    o=$(ours "$1" "$2" "$3" "$4"); t=$(theirs "$1" "$2" "$3" "$4")
    echo "{\"bench\":\"gpu_vs_pytorch\",\"model\":\"$5\",\"batch\":$3,\"world\":1,\"ours\":$o,\"pytorch\":$t,\"ratio\":$($PY -c "print(round($o/$t,3))")}"
  done
done
