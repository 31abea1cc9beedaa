#!/usr/bin/env bash
# DP vs DDP vs single: one config (Fashion-MNIST CNN, global batch 128, the same
# samples in every run) trained in each mode on 1, 2 and 4 devices — CPU
# replicas/processes here, GPUs when present. Writes RESULTS_dp.md and
# dp_compare.png next to this script. About 5 minutes on a 2-core CPU machine.
#
#   bash bench/dp/run_dp_compare.sh [BUILD_DIR] [key=value ...]
#   e.g. bash bench/dp/run_dp_compare.sh build data.train_limit=10240
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
[[ $# -gt 0 ]] && shift
extra=("$@")
worker=$build/worker
launcher=$build/ddp-launch
for b in "$worker" "$launcher"; do
  [[ -x $b ]] || { echo "run_dp_compare: $b not built; run: cmake --build $build --target worker ddp-launch" >&2; exit 2; }
done
python=${PY:-$root/.venv/bin/python}  # the reference PyTorch 2.x (scripts/setup.sh)
out=${DP_BENCH_OUT:-$root/out/bench_dp}
rm -rf "$out" && mkdir -p "$out"

global_batch=128
common=(configs/fmnist_cnn_ddp.yaml seed=0 data.train_limit=20480 train.epochs=1
        train.log_every=40 eval.batch_size=100)

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l || echo 0)
fi
if (( gpus > 0 )); then
  kind=cuda
  echo "run_dp_compare: $gpus GPU(s) visible; comparing on GPUs (one per replica/process)"
else
  kind=cpu
  echo "run_dp_compare: no GPU; comparing CPU replicas (threads) and CPU processes, one intra-op thread each"
fi

run() {  # run NAME DEVICES -- command...
  local name=$1 n=$2; shift 3
  echo "== $name ($n device(s))"
  local start=$SECONDS
  cut -d' ' -f1 /proc/loadavg >"$out/$name.load"  # other work on the machine skews the timings
  if ! (cd "$root" && "$@" output.dir="$out/$name" "${extra[@]}") >"$out/$name.log" 2>&1; then
    echo "run_dp_compare: $name failed; see $out/$name.log" >&2
    tail -5 "$out/$name.log" >&2
    exit 1
  fi
  echo "   $(( SECONDS - start )) s, $(grep -o '"samples_per_s": [0-9.]*' "$out/$name/summary.json")"
}

for n in 1 2 4; do
  if [[ $kind == cuda ]]; then
    (( n <= gpus )) || continue
    ids=$(seq -s, 0 $((n - 1)))
    dev=(device=cuda)
    dpdev=(device=cuda "dp.device_ids=[$ids]")
  else
    dev=(device=cpu)
    dpdev=(device=cpu dp.replicas=$n)
  fi
  # single: one process; on CPU its N devices are N intra-op threads.
  if [[ $kind == cpu || $n == 1 ]]; then  # single uses one GPU, so on GPUs only once
    run single_$n $n -- "$worker" "${common[@]}" mode=single "${dev[@]}" \
        threads=$([[ $kind == cpu ]] && echo $n || echo 0) train.batch_size=$global_batch
  fi
  run dp_$n $n -- "$worker" "${common[@]}" mode=dp "${dpdev[@]}" threads=1 train.batch_size=$global_batch
  run ddp_$n $n -- "$launcher" --nproc_per_node=$n "$worker" "${common[@]}" mode=ddp "${dev[@]}" threads=1 \
      train.batch_size=$((global_batch / n))
done

"$python" "$here/report.py" "$out" "$here/RESULTS_dp.md" "$here/dp_compare.png" "$kind"
