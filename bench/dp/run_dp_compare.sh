#!/usr/bin/env bash
# DP vs DDP vs single vs PyTorch DDP: one config (Fashion-MNIST CNN, global batch 128, the same
# samples in every run) trained in each mode on 1 and 2 devices (4 where the machine has the cores,
# or with OVERSUBSCRIBE=1) — CPU replicas/processes here, GPUs when present — beside PyTorch's own
# DistributedDataParallel (bench/ddp_reference.py cnn: the same CNN over Gloo, the same per-rank
# batch and steps, OMP_NUM_THREADS=1 per rank), plus an uneven case (dp with a global batch that
# torch.chunk splits unevenly, 129 over 2 replicas: 65 + 64; 130 over 4: 33 + 33 + 33 + 31) against
# single on the same batch.
#
# REPS rounds; each round runs every configuration once, the order rotated by one each round, so
# drift on a shared machine hits every configuration alike. samples/s is the steady rate from the
# worker's metrics.jsonl: from the end of the first log window (step train.log_every) to the last
# logged step (warm-up and start-up excluded); PyTorch: the same steps after the same warm-up.
# report.py pairs the configurations within each round and reports the medians of those ratios.
#
#   bash bench/dp/run_dp_compare.sh [BUILD_DIR] [key=value ...]
#   REPS=5 OVERSUBSCRIBE=1 bash bench/dp/run_dp_compare.sh build data.train_limit=10240
# Environment:
#   REPS=3            rounds
#   OVERSUBSCRIBE=0   1: also run (and label) rows with more threads/processes/replicas than cores
#   DP_BENCH_OUT      the runs' output folder (default: out/bench_dp under the repository)
#   DP_RESULTS_DIR    where RESULTS_dp.md and dp_compare.png go (default: next to this script)
#   PY                Python with the reference PyTorch (default: .venv/bin/python)
# About 2 minutes a round on a 2-core CPU machine (10 configurations; ~20 s more with OVERSUBSCRIBE=1
# per extra row).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
invocation="REPS=${REPS:-3} OVERSUBSCRIBE=${OVERSUBSCRIBE:-0} bash bench/dp/run_dp_compare.sh $*"
build=${1:-$root/build}
[[ $# -gt 0 ]] && shift
extra=("$@")
build=$(cd "$build" && pwd)
worker=$build/worker
launcher=$build/ddp-launch
for b in "$worker" "$launcher"; do
  [[ -x $b ]] || { echo "run_dp_compare: $b not built; run: cmake --build $build --target worker ddp-launch" >&2; exit 2; }
done
python=${PY:-$root/.venv/bin/python}  # the reference PyTorch 2.x (scripts/setup.sh)
reps=${REPS:-3}
oversubscribe=${OVERSUBSCRIBE:-0}
out=${DP_BENCH_OUT:-$root/out/bench_dp}
results=${DP_RESULTS_DIR:-$here}
rm -rf "$out" && mkdir -p "$out" "$results"
out=$(cd "$out" && pwd)

global_batch=128
train_limit=20480
log_every=40
for kv in "${extra[@]}"; do  # the steps PyTorch runs follow ours
  case $kv in
    data.train_limit=*) train_limit=${kv#*=} ;;
    train.log_every=*) log_every=${kv#*=} ;;
  esac
done
common=(configs/fmnist_cnn_ddp.yaml seed=0 data.train_limit=$train_limit train.epochs=1
        train.log_every=$log_every eval.batch_size=100)
cores=$(getconf _NPROCESSORS_ONLN)

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

# The configurations: NAME DEVICES GLOBAL_BATCH THREADS_PER_PROCESS, and a command per NAME (cmd_of).
configs=()
oversubscribed=()
add() {  # add NAME DEVICES BATCH CPU_SLOTS  (CPU_SLOTS: threads + processes + replicas it keeps busy)
  if [[ $kind == cpu ]] && (( $4 > cores )); then
    if [[ $oversubscribe != 1 ]]; then
      echo "run_dp_compare: skipping $1 ($4 threads/processes on $cores cores; OVERSUBSCRIBE=1 runs it)"
      return
    fi
    oversubscribed+=("$1")
  fi
  configs+=("$1 $2 $3")
}
uneven_batch() { (( $1 == 4 )) && echo 130 || echo $((global_batch + 1)); }  # torch.chunk: 33,33,33,31 / 65,64
for n in 1 2 4; do
  if [[ $kind == cuda ]]; then (( n <= gpus )) || continue; fi
  if [[ $kind == cpu || $n == 1 ]]; then add single_$n $n $global_batch $n; fi  # single uses one GPU
  add dp_$n $n $global_batch $n
  add ddp_$n $n $global_batch $n
  if (( n > 1 )); then
    [[ $kind == cpu ]] && add ddpgloo_$n $n $global_batch $n  # ours over Gloo too, PyTorch's transport
    add torch_$n $n $global_batch $n
    ub=$(uneven_batch $n)
    add dpuneven_$n $n $ub $n
    if [[ " ${configs[*]} " == *" dpuneven_$n "* && " ${configs[*]} " != *" single1uneven$ub "* ]]; then
      add single1uneven$ub 1 $ub 1  # its baseline: the same batches on one device
    fi
  fi
done

cmd_of() {  # cmd_of NAME DEVICES BATCH DIR: prints the command, one word a line
  local name=$1 n=$2 batch=$3 dir=$4 dev dpdev
  if [[ $kind == cuda ]]; then
    dev=(device=cuda); dpdev=(device=cuda "dp.device_ids=[$(seq -s, 0 $((n - 1)))]")
  else
    dev=(device=cpu); dpdev=(device=cpu dp.replicas=$n)
  fi
  local steps=$((train_limit / batch))
  case $name in
    single_* | single1uneven*)
      printf '%s\n' env OMP_NUM_THREADS=$([[ $kind == cpu ]] && echo "$n" || echo 1) "$worker" "${common[@]}" \
        mode=single "${dev[@]}" threads=$([[ $kind == cpu ]] && echo "$n" || echo 0) train.batch_size=$batch ;;
    dp_* | dpuneven_*)
      printf '%s\n' env OMP_NUM_THREADS=1 "$worker" "${common[@]}" mode=dp "${dpdev[@]}" threads=1 train.batch_size=$batch ;;
    ddp_*)
      printf '%s\n' env OMP_NUM_THREADS=1 "$launcher" --nproc_per_node=$n "$worker" "${common[@]}" mode=ddp \
        "${dev[@]}" threads=1 train.batch_size=$((batch / n)) ;;
    ddpgloo_*)
      printf '%s\n' env OMP_NUM_THREADS=1 "$launcher" --nproc_per_node=$n "$worker" "${common[@]}" mode=ddp \
        backend=gloo "${dev[@]}" threads=1 train.batch_size=$((batch / n)) ;;
    torch_*)
      printf '%s\n' env OMP_NUM_THREADS=1 DDP_BENCH_DEVICE=$kind "$launcher" --nproc_per_node=$n "$python" \
        "$root/bench/ddp_reference.py" cnn 0 $((batch / n)) "$log_every" $((steps - log_every)) ;;
  esac
  if [[ $name != torch_* ]]; then
    printf '%s\n' output.dir="$dir" "${extra[@]}"
  fi
}

run() {  # run ROUND POSITION NAME DEVICES BATCH
  local round=$1 pos=$2 name=$3 n=$4 batch=$5
  local dir=$out/r$round/$name
  mkdir -p "$out/r$round"
  local -a cmd
  mapfile -t cmd < <(cmd_of "$name" "$n" "$batch" "$dir")
  printf '%q ' "${cmd[@]}" >"$dir.cmd"; echo >>"$dir.cmd"
  cut -d' ' -f1 /proc/loadavg >"$dir.load"  # other work on the machine skews the timings
  local start=$SECONDS
  if ! (cd "$root" && "${cmd[@]}") >"$dir.log" 2>&1; then
    echo "run_dp_compare: $name (round $round) failed; see $dir.log" >&2
    tail -5 "$dir.log" >&2
    exit 1
  fi
  if [[ $name == torch_* ]]; then
    grep samples_per_s "$dir.log" | tail -1 | sed 's/^\[rank 0\] //' >"$dir.json"
    echo "   r$round #$pos $name: $(( SECONDS - start )) s, $(cat "$dir.json")"
  else
    echo "   r$round #$pos $name: $(( SECONDS - start )) s, whole loop $(grep -o '"samples_per_s": [0-9.]*' "$dir/summary.json")"
  fi
}

libtorch=$(cat "$build/libtorch_version.txt" 2>/dev/null || echo "?")
pytorch=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "?")
head=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo "?")
dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
start_time=$(date -u +%Y-%m-%dT%H:%M:%SZ)
echo "run_dp_compare: $reps round(s) of ${#configs[@]} configurations: ${configs[*]// [0-9]* [0-9]*/}"
echo "run_dp_compare: HEAD $head, LibTorch $libtorch, PyTorch $pytorch, load $load_start"

orders=()
for ((i = 0; i < reps; i++)); do
  order=()
  for ((k = 0; k < ${#configs[@]}; k++)); do
    order+=("${configs[$(( (k + i) % ${#configs[@]} ))]}")
  done
  echo "== round $((i + 1)) of $reps"
  names=()
  for ((k = 0; k < ${#order[@]}; k++)); do
    read -r name n batch <<<"${order[$k]}"
    names+=("$name")
    run $((i + 1)) $((k + 1)) "$name" "$n" "$batch"
  done
  orders+=("$(IFS=,; echo "${names[*]}")")
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# Everything the report needs to say how these figures were made.
"$python" - "$out/meta.json" <<PY
import json, sys
json.dump({"kind": "$kind", "reps": $reps, "cores": $cores, "oversubscribe": "$oversubscribe" == "1",
           "oversubscribed": "${oversubscribed[*]-}".split(), "configs": "${configs[*]}".split()[0::3],
           "global_batch": $global_batch, "train_limit": $train_limit, "log_every": $log_every,
           "libtorch": "$libtorch", "pytorch": "$pytorch", "head": "$head", "dirty_files": $dirty,
           "load_start": "$load_start", "load_end": "$load_end", "start_utc": "$start_time",
           "end_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "orders": "${orders[*]}".split(),
           "invocation": """$invocation""".strip()},
          open(sys.argv[1], "w"), indent=1)
PY
"$python" "$here/report.py" "$out" "$results/RESULTS_dp.md" "$results/dp_compare.png" "$kind"
