#!/usr/bin/env bash
# Issue 42 (7), the GPU half: a GPT-2-small-class model (12 layers, 12 heads, 768 wide, block 1024,
# vocab 50304, no bias, dropout 0), bf16 autocast, fused AdamW (nanoGPT's two groups), clipping at
# 1.0, 12 windows per step, at world 1 on one GPU:
#   ours eager          ddp-launch --nproc_per_node=1 worker (train.cuda_graph=false)
#   nanogpt eager       nanoGPT's train.py --compile=False (no torchrun: world 1 is its plain loop)
#   ours cuda_graph     train.cuda_graph=true (the step captured once, replayed)
#   nanogpt compile     nanoGPT's train.py --compile=True (its default, torch.compile(model))
# in that order per rep, the two sides taking turns first (rep 2 starts with nanoGPT). Tokens/s is
# the median over the log windows after SKIP steps; each window is LOG steps between two syncs on
# the host (ours: the loss read at a log step; nanoGPT: its loss.item() at a log step, the scratch
# copy prints time.time() there: the one added line below). MFU: ours (nanoGPT's estimate_mfu
# formula against the GPU's bf16 peak), nanoGPT's scaled by the tokens/s ratio (the same model and
# formula; nanoGPT's own printout divides by an A100's 312 TFLOP/s). Peak memory: ours from
# summary.json (cuda_peak_allocated_mb_per_device), nanoGPT's torch.cuda.max_memory_allocated()
# printed at its end (the second added line).
#
#   NANOGPT=.gpu/nanogpt DATA=.gpu/gpt_data BUILD=build-gpu PY=python3 bash bench/gpt/run_gpu.sh > gpt.jsonl
#   python3 bench/gpt/gpu_table.py gpt.jsonl
#
# NANOGPT: a folder holding karpathy/nanoGPT's train.py, model.py and configurator.py (the user's
# checkout; nothing of it is copied into this project: `bash scripts/gpu_check.sh pack` copies them
# into the ignored .gpu/ for the device machine). DATA: nanoGPT-format train.bin/val.bin (raw uint16,
# no meta.pkl, so nanoGPT takes vocab 50304 as for GPT-2); ours reads the same train.bin.
# Env: STEPS (100), LOG (10), SKIP (30), REPS (2), DEADLINE_S (360: no run starts after it),
#   RUN_TIMEOUT_S (240), VARIANTS ("eager graph"), BATCH (12), and for a dry run of this script on a
#   CPU: DEVICE=cpu DTYPE=float32 MODEL="n_layer=2 n_head=2 n_embd=64 block_size=64" VARIANTS=eager.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build-gpu}
py=$(command -v "${PY:-python3}")
[[ $py == /* ]] || py=$PWD/$py  # absolute (nanoGPT runs in its own folder), the venv kept
nanogpt=$(realpath "${NANOGPT:-.gpu/nanogpt}")
data=$(realpath "${DATA:-.gpu/gpt_data}")
steps=${STEPS:-100}
log=${LOG:-10}
skip=${SKIP:-30}
reps=${REPS:-2}
deadline=${DEADLINE_S:-360}
run_timeout=${RUN_TIMEOUT_S:-240}
variants=${VARIANTS:-"eager graph"}
batch=${BATCH:-12}
device=${DEVICE:-cuda}
dtype=${DTYPE:-bfloat16}
read -r -a model <<< "${MODEL:-n_layer=12 n_head=12 n_embd=768 block_size=1024}"
for f in train.py model.py configurator.py; do
  [[ -f $nanogpt/$f ]] || { echo "run_gpu.sh: no $nanogpt/$f; set NANOGPT to a karpathy/nanoGPT checkout" >&2; exit 2; }
done
[[ -f $data/train.bin ]] || { echo "run_gpu.sh: no $data/train.bin; bash scripts/gpu_check.sh pack makes it" >&2; exit 2; }
[[ -x $build/worker ]] || { echo "run_gpu.sh: no $build/worker; build it first" >&2; exit 2; }
work=$(mktemp -d /tmp/ddp_gpt_gpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
block=$(printf '%s\n' "${model[@]}" | sed -n 's/^block_size=//p')

# nanoGPT from a scratch copy: its data folder is ours; two lines added for the figures.
mkdir -p "$work/nanogpt/data"
cp "$nanogpt"/{train.py,model.py,configurator.py} "$work/nanogpt/"
ln -s "$data" "$work/nanogpt/data/bench"
sed -i 's/^\(\s*\)lossf = loss.item() \* gradient_accumulation_steps$/&; wall = time.time()/; s/mfu {running_mfu\*100:.2f}%")$/mfu {running_mfu*100:.2f}%, wall {wall:.6f}")/' \
    "$work/nanogpt/train.py"
echo 'print(f"peak_allocated_mb {torch.cuda.max_memory_allocated() / 2**20:.1f}" if torch.cuda.is_available() else "peak_allocated_mb -1")' \
    >> "$work/nanogpt/train.py"
diff "$nanogpt/train.py" "$work/nanogpt/train.py" | sed 's/^/# patched: /' >&2
grep -q 'wall {wall:.6f}' "$work/nanogpt/train.py" || { echo "run_gpu.sh: train.py's log line was not found to patch" >&2; exit 1; }

precision=$([[ $dtype == bfloat16 ]] && echo bf16 || echo fp32)
backend=$([[ $device == cuda ]] && echo nccl || echo gloo)
ours() {  # $1 eager|graph, $2 out dir
  local overrides=()
  for kv in "${model[@]}"; do overrides+=("model.$kv"); done
  timeout -k 10 "$run_timeout" "$build/ddp-launch" --nproc_per_node=1 "$build/worker" configs/gpt_fortunes_char.yaml \
    device="$device" backend="$backend" "${overrides[@]}" model.vocab_size=50304 model.dropout=0.0 model.bias=false \
    data.train_files="$data/train.bin" data.val_files= data.sampling=random \
    train.batch_size="$batch" train.epochs=1000 train.max_steps="$steps" train.precision="$precision" \
    train.optimizer=adamw train.lr=6e-4 train.min_lr=6e-5 train.warmup_steps=10 train.betas='[0.9, 0.95]' \
    train.weight_decay=0.1 train.clip_grad_norm=1.0 train.fused=true train.log_every="$log" \
    train.cuda_graph=$([[ $1 == graph ]] && echo true || echo false) eval.enabled=false output.dir="$2" > "$2.log" 2>&1
}
theirs() {  # $1 eager|graph (graph: torch.compile), $2 log file
  local flags=()
  for kv in "${model[@]}"; do flags+=("--$kv"); done
  (cd "$work/nanogpt" && timeout -k 10 "$run_timeout" "$py" train.py --dataset=bench --device="$device" --dtype="$dtype" \
    --compile=$([[ $1 == graph ]] && echo True || echo False) "${flags[@]}" --dropout=0.0 --bias=False \
    --batch_size="$batch" --gradient_accumulation_steps=1 --max_iters="$steps" --lr_decay_iters="$steps" \
    --warmup_iters=10 --learning_rate=6e-4 --min_lr=6e-5 --weight_decay=0.1 --beta2=0.95 --grad_clip=1.0 \
    --eval_interval=100000 --eval_iters=1 --log_interval="$log" --always_save_checkpoint=False \
    --out_dir="$work/nanogpt_out") > "$2" 2>&1
}
# One JSON line per run (the figures, or "failed" with the log's last line): bench/gpt/gpu_record.py.
report() {  # side variant rep dir-or-log rc seconds
  "$py" bench/gpt/gpu_record.py "$@" "$skip" "$log" "$batch" "$block"
}

name=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo cpu) | head -1)
torch_version=$("$py" -c 'import torch; print(torch.__version__)')
echo "{\"bench\": \"gpt_gpu\", \"kind\": \"env\", \"gpu\": \"$name\", \"torch\": \"$torch_version\", \"steps\": $steps, \"log\": $log, \"skip\": $skip, \"batch\": $batch, \"block\": $block, \"model\": \"${model[*]}\", \"dtype\": \"$dtype\"}"
start=$SECONDS
done_runs=0
stopped=finished
for ((rep = 1; rep <= reps; rep++)); do
  for variant in $variants; do
    sides=(ours theirs)
    (( rep % 2 == 0 )) && sides=(theirs ours)
    for side in "${sides[@]}"; do
      if (( SECONDS - start > deadline )); then stopped=deadline; break 3; fi
      t0=$SECONDS
      if [[ $side == ours ]]; then
        out="$work/ours_${variant}_$rep"
        ours "$variant" "$out"; rc=$?
        report ours "$variant" "$rep" "$out" "$rc" $((SECONDS - t0))
      else
        out="$work/nanogpt_${variant}_$rep.log"
        theirs "$variant" "$out"; rc=$?
        report nanogpt "$([[ $variant == graph ]] && echo compile || echo eager)" "$rep" "$out" "$rc" $((SECONDS - t0))
      fi
      done_runs=$((done_runs + 1))
    done
  done
done
echo "{\"bench\": \"gpt_gpu\", \"stopped\": \"$stopped\", \"done\": $done_runs, \"seconds\": $((SECONDS - start))}"
