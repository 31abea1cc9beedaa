#!/usr/bin/env bash
# Ours vs Python PyTorch on one GPU (NCCL, world 1), same model, per-rank batch, synthetic
# host-memory data (pinned on both sides), SGD(0.01, momentum 0.9), steady-state samples/s.
# Budget-aware: made to run once inside a few minutes of lent GPU time.
#   BUILD=build-gpu PY=python3 DEADLINE_S=240 bash bench/gpu/run_gpu_bench.sh > gpu_bench.jsonl
#   python3 bench/gpu/make_table.py gpu_bench.jsonl --gpu "NVIDIA H100 80GB HBM3"
#
# Per model x batch x precision, in this order (most important comparisons first):
#   ours reducer_on   comm.ddp_on_one_rank=true: our DDP engine and its NCCL all-reduces run at
#                     world 1, as PyTorch's DDP does (the fair comparison)
#   pytorch ddp       bench/gpu/python_gpu_reference.py --variant ddp (eager DDP, SGD's default: foreach)
#   pytorch ddp_fused the same with SGD(fused=True), a careful user's fastest eager optimizer
#   pytorch ddp_dataloader  ddp_fused with the batches from DataLoader(num_workers=2, pin_memory=True):
#                     assembled off the main thread, as ours are (the like-for-like loader)
#   ours inline       reducer on with data.num_workers=0: the batch gathered on the main thread, as
#                     pytorch ddp / ddp_fused do (the other like-for-like loader)
#   ours unfused      reducer on with train.fused=false: LibTorch's per-parameter SGD (what fused SGD saves)
#   ours reducer_off  the default: a 1-rank job skips the reducer
#   pytorch compile   the DDP model under torch.compile(mode="reduce-overhead"); only for CNN b64
#                     and the 24M MLP unless COMPILE_ALL=1 (compiling is slow)
#   ours cuda_graph   train.cuda_graph=true: the whole step captured once and replayed (reducer off)
#   ours cuda_graph_on  the same with comm.ddp_on_one_rank=true: the reducer's NCCL all-reduce in the graph
# Ours: the rate of the last metrics.jsonl line = steps W+1..2W (log_every=W, max_steps=2W).
# PyTorch: --warmup W --timed W, the same window.
# Each run prints one JSON line at once; after each model x batch x precision one "ratio" line;
# the last line is {"bench":"gpu","stopped":"deadline"|"finished","done":N}.
# Env: BUILD (build), PY (python3 or .venv), DEADLINE_S (240: no run starts after it),
#   HARD_S (DEADLINE_S+30: no run goes on past it), RUN_TIMEOUT_S (120 per run),
#   PRECISIONS ("fp32 bf16"), COMPILE_ALL (0), ONLY (run only the specs whose label matches
#   this extended regex, e.g. ONLY='^CNN b64'). Logs of failed runs stay in the temp dir; their
#   last 5 lines go to stderr.
set -uo pipefail  # not -e: a failed run is recorded as an "error" line, the bench goes on
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python; else PY=$(command -v python3); fi
fi
DEADLINE_S=${DEADLINE_S:-240}
HARD_S=${HARD_S:-$((DEADLINE_S + 30))}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-120}
PRECISIONS=${PRECISIONS:-fp32 bf16}
COMPILE_ALL=${COMPILE_ALL:-0}
ONLY=${ONLY:-}
LAUNCH="$BUILD/ddp-launch"
TMP=$(mktemp -d /tmp/ddp_gpu_bench_XXXXXX)
SECONDS=0
DONE=0

# One JSON object from key=value (string), key:=value (raw JSON) and @=OBJECT (merged) arguments.
json() {
  "$PY" -c '
import json, sys
d = {}
for a in sys.argv[1:]:
    k, _, v = a.partition("=")
    if k == "@":
        d.update(json.loads(v))
    elif k.endswith(":"):
        d[k[:-1]] = json.loads(v)
    else:
        d[k] = v
print(json.dumps(d), flush=True)' "$@"
}

# The seconds the next run may take: RUN_TIMEOUT_S, less when HARD_S is nearer.
run_limit() {
  local left=$((HARD_S - SECONDS))
  if ((left < RUN_TIMEOUT_S)); then echo $((left > 5 ? left : 5)); else echo "$RUN_TIMEOUT_S"; fi
}

# An error message for a failed run: a timeout, else the first log line naming KEY, else the
# worker's last log line.
run_error() {  # rc log key limit
  if (($1 == 124 || $1 == 137)); then echo "timeout after $4 s (rc $1)"; return; fi
  local line=""
  if [ -n "$3" ]; then  # preferably a line that names the key and says what is wrong
    line=$(grep -- "$3" "$2" | grep -m1 -Ei 'error|unknown|invalid|refus|fail|not ')
    [ -z "$line" ] && line=$(grep -m1 -- "$3" "$2")
  fi
  # The worker's own last line (the launcher prefixes it; its failure summary follows unprefixed).
  [ -z "$line" ] && line=$(grep '^\[rank 0\] .*[^[:space:]]' "$2" | tail -1)
  [ -z "$line" ] && line=$(grep -v '^[[:space:]]*$' "$2" | tail -1)
  line=${line#"[rank 0] "}
  echo "rc $1: ${line:0:400}"
}

show_failure() {  # log what
  echo "run_gpu_bench: $2 failed; last lines of $1:" >&2
  tail -5 "$1" | sed 's/^/  /' >&2
}

declare -A R  # variant -> samples/s of the current model x batch x precision

ours() {  # model hidden batch W precision variant label
  local model=$1 hidden=$2 batch=$3 w=$4 prec=$5 variant=$6 label=$7 key="" extra=()
  case $variant in
    reducer_on) extra=(comm.ddp_on_one_rank=true); key=ddp_on_one_rank ;;
    unfused) extra=(comm.ddp_on_one_rank=true train.fused=false); key=ddp_on_one_rank ;;
    inline) extra=(comm.ddp_on_one_rank=true data.num_workers=0); key=num_workers ;;
    cuda_graph) extra=(train.cuda_graph=true); key=cuda_graph ;;
    cuda_graph_on) extra=(train.cuda_graph=true comm.ddp_on_one_rank=true); key=cuda_graph ;;
  esac
  local dir=$TMP/ours_${model}_b${batch}_${prec}_${variant}
  local log=$dir.log limit rc=0 t0=$SECONDS
  limit=$(run_limit)
  timeout -k 5 "$limit" "$LAUNCH" --nproc_per_node=1 "$BUILD/worker" configs/synthetic_mlp.yaml \
    device=cuda backend=nccl model.name="$model" "model.hidden=[$hidden]" train.batch_size="$batch" \
    train.max_steps=$((2 * w)) train.log_every="$w" train.epochs=1000 eval.enabled=false \
    data.synthetic_train=8192 data.pin_memory=true train.precision="$prec" train.lr=0.01 seed=0 \
    output.dir="$dir" ${extra[@]+"${extra[@]}"} >"$log" 2>&1 || rc=$?
  local common=(bench=gpu "label=$label" "model=$model" "hidden=$hidden" "batch:=$batch" "precision=$prec"
    side=ours "variant=$variant" "window_steps:=$w" "wall_s:=$((SECONDS - t0))")
  local last="" rate="" step="" loss=""
  [ -s "$dir/metrics.jsonl" ] && last=$(tail -1 "$dir/metrics.jsonl")
  if ((rc == 0)) && [ -n "$last" ]; then
    read -r rate step loss < <("$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["samples_per_s"], d["step"], d["loss"])' "$last")
  fi
  if ((rc == 0)) && [ -n "$rate" ] && [ "$step" = $((2 * w)) ]; then
    R[$variant]=$rate
    # The last logged loss: variants of one model train alike (a graph that did not train would show).
    json "${common[@]}" "samples_per_s:=$rate" "last_step:=$step" "loss:=$loss"
  else
    local err
    if ((rc == 0)); then err="no steady-state line in metrics.jsonl (last step ${step:-none}, expected $((2 * w)))"
    else err=$(run_error "$rc" "$log" "$key" "$limit"); fi
    json "${common[@]}" "samples_per_s:=null" "error=$err"
    show_failure "$log" "ours $variant $label $prec"
  fi
  DONE=$((DONE + 1))
}

theirs() {  # model hidden batch W precision variant label
  local model=$1 hidden=$2 batch=$3 w=$4 prec=$5 variant=$6 label=$7
  local log=$TMP/pytorch_${model}_b${batch}_${prec}_${variant}.log limit rc=0 t0=$SECONDS args
  case $variant in
    ddp_dataloader) args=(--variant ddp_fused --loader dataloader --workers 2) ;;
    *) args=(--variant "$variant") ;;
  esac
  limit=$(run_limit)
  timeout -k 5 "$limit" "$LAUNCH" --nproc_per_node=1 "$PY" bench/gpu/python_gpu_reference.py \
    --model "$model" --hidden "$hidden" --batch "$batch" --warmup "$w" --timed "$w" \
    --precision "$prec" "${args[@]}" >"$log" 2>&1 || rc=$?
  local common=(bench=gpu "label=$label" "model=$model" "hidden=$hidden" "batch:=$batch" "precision=$prec"
    side=pytorch "variant=$variant" "window_steps:=$w" "wall_s:=$((SECONDS - t0))")
  # The script's own line (the launcher prefixes '[rank 0] '): samples_per_s, or an "error".
  local line
  line=$(grep -E '"(samples_per_s|error)"' "$log" | sed 's/^\[rank 0\] //' | grep '^{' | tail -1)
  local out
  out=$("$PY" -c '
import json, sys
line, rc = sys.argv[1], int(sys.argv[2])
try:
    d = json.loads(line)
except ValueError:
    sys.exit(1)
keep = {k: d[k] for k in ("samples_per_s", "seconds", "warmup_s", "device", "torch", "loader", "workers", "cudagraph_skips",
                          "graph_breaks", "error") if k in d}
if rc != 0 and "error" not in keep:
    sys.exit(1)
print(json.dumps(keep))' "$line" "$rc")
  local ok=$?
  if ((ok == 0)) && ! grep -q '"error"' <<<"$out" && ((rc == 0)); then
    R[py_$variant]=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["samples_per_s"])' "$out")
    json "${common[@]}" "@=$out"
  else
    local err
    if ((ok == 0)); then err=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1]).get("error", ""))' "$out")
    else err=$(run_error "$rc" "$log" "" "$limit"); fi
    json "${common[@]}" "samples_per_s:=null" "error=$err"
    show_failure "$log" "pytorch $variant $label $prec"
  fi
  DONE=$((DONE + 1))
}

ratios() {  # model batch precision label
  ((${#R[@]} == 0)) && return
  local k kv=()
  for k in "${!R[@]}"; do kv+=("$k=${R[$k]}"); done
  "$PY" -c '
import json, sys
model, batch, prec, label = sys.argv[1:5]
r = dict(a.split("=", 1) for a in sys.argv[5:])
r = {k: float(v) for k, v in r.items()}
ours = {k: v for k, v in r.items() if not k.startswith("py_")}
best = max(ours, key=ours.get) if ours else None
def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None
print(json.dumps({"bench": "gpu", "kind": "ratio", "label": label, "model": model, "batch": int(batch),
                  "precision": prec,
                  "ours_reducer_on_vs_pytorch_ddp": ratio(r.get("reducer_on"), r.get("py_ddp")),
                  "ours_reducer_on_vs_pytorch_ddp_fused": ratio(r.get("reducer_on"), r.get("py_ddp_fused")),
                  "ours_reducer_on_vs_pytorch_ddp_dataloader": ratio(r.get("reducer_on"), r.get("py_ddp_dataloader")),
                  "ours_inline_vs_pytorch_ddp_fused": ratio(r.get("inline"), r.get("py_ddp_fused")),
                  "ours_best_vs_pytorch_compile": ratio(ours.get(best), r.get("py_compile")),
                  "ours_best_variant": best}), flush=True)' "$@" "${kv[@]}"
}

deadline() {
  if ((SECONDS > DEADLINE_S)); then
    json bench=gpu stopped=deadline "done:=$DONE" "elapsed_s:=$SECONDS" "deadline_s:=$DEADLINE_S"
    return 0
  fi
  return 1
}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
torch_version=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null)
json bench=gpu kind=env "gpu=$gpu" "torch=$torch_version" "deadline_s:=$DEADLINE_S" "hard_s:=$HARD_S" "tmp=$TMP"
if [ ! -x "$LAUNCH" ] || [ ! -x "$BUILD/worker" ]; then echo "run_gpu_bench: no $LAUNCH or $BUILD/worker (BUILD=$BUILD)" >&2; exit 1; fi

# model hidden batch W compile? label   (priority order)
SPECS=(
  "cnn 512,256 64 200 1 CNN b64"
  "mlp 512,256 64 200 0 MLP 784-512-256-10 b64"
  "cnn 512,256 512 100 0 CNN b512"
  "mlp 4096,4096,1024 256 100 1 MLP 784-4096-4096-1024-10 (24.2M) b256"
)
for spec in "${SPECS[@]}"; do
  read -r model hidden batch w compile label <<<"$spec"
  [ -n "$ONLY" ] && ! grep -Eq -- "$ONLY" <<<"$label" && continue
  for prec in $PRECISIONS; do
    R=()
    stop=0
    for run in "ours reducer_on" "theirs ddp" "theirs ddp_fused" "theirs ddp_dataloader" "ours inline" \
               "ours reducer_off" "theirs compile" "ours cuda_graph" "ours cuda_graph_on" "ours unfused"; do
      set -- $run  # word splitting intended: function variant
      if [ "$2" = compile ] && [ "$compile" != 1 ] && [ "$COMPILE_ALL" != 1 ]; then continue; fi
      if deadline; then stop=1; break; fi
      "$1" "$model" "$hidden" "$batch" "$w" "$prec" "$2" "$label"
    done
    ratios "$model" "$batch" "$prec" "$label"
    ((stop)) && exit 0
  done
done
json bench=gpu stopped=finished "done:=$DONE" "elapsed_s:=$SECONDS"
