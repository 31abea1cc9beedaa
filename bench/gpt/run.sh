#!/usr/bin/env bash
# Issue 42 (7): tokens/s of our GPT against nanoGPT's train.py under torchrun, same model, batch,
# block, AdamW, fp32, compile off, on the CPU, 2 ranks x 1 thread, sides alternated, in one run.
#
#   NANOGPT_DIR=/path/to/nanoGPT REPS=3 STEPS=120 bash bench/gpt/run.sh [build]
#
# nanoGPT is the user's checkout (karpathy/nanoGPT: train.py, model.py, configurator.py); nothing
# of it is copied into this project. It is run from a scratch copy in which train.py's DDP branch
# keeps device='cpu' (upstream it always picks cuda:LOCAL_RANK; three lines, printed below). Both
# sides read the same nanoGPT-format files (train.bin / val.bin, raw uint16) made by
# scripts/prepare_text.py from Debian's fortunes (bash scripts/setup.sh --corpus). The figure is the
# steady state: the median of the logged windows' tokens/s after the first LOG steps.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
: "${NANOGPT_DIR:?set NANOGPT_DIR to a karpathy/nanoGPT checkout}"
reps=${REPS:-3}
steps=${STEPS:-120}
fused=${FUSED:-0}    # 1: both sides step with PyTorch's fused AdamW (on the CPU too; nanoGPT picks it on CUDA only)
log=20
py=.venv/bin/python
work=$(mktemp -d /tmp/ddp_gpt_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The corpus, in nanoGPT's format (ours reads it too).
mapfile -t inputs < <(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort)
[[ ${#inputs[@]} -gt 0 ]] || { echo "run.sh: no /usr/share/games/fortunes; bash scripts/setup.sh --corpus" >&2; exit 2; }
$py scripts/prepare_text.py "${inputs[@]}" --out "$work/data/fortunes" --level char --format nanogpt >/dev/null
vocab=$($py -c "import json; print(json.load(open('$work/data/fortunes/meta.json'))['vocab_size'])")

# nanoGPT, from a scratch copy: the DDP branch keeps the CPU.
mkdir -p "$work/nanogpt"
cp "$NANOGPT_DIR"/{train.py,model.py,configurator.py} "$work/nanogpt/"
if (( fused )); then
  sed -i "s/use_fused = fused_available and device_type == 'cuda'/use_fused = fused_available/" "$work/nanogpt/model.py"
  diff <(cd "$NANOGPT_DIR" && cat model.py) "$work/nanogpt/model.py" | sed 's/^/patched: /' || true
fi
ln -s "$work/data" "$work/nanogpt/data"
sed -i "s/    device = f'cuda:{ddp_local_rank}'/    device = device if device == 'cpu' else f'cuda:{ddp_local_rank}'/; \
        s/    torch.cuda.set_device(device)/    if device != 'cpu': torch.cuda.set_device(device)/; \
        s/    model = DDP(model, device_ids=\[ddp_local_rank\])/    model = DDP(model, device_ids=None if device == 'cpu' else [ddp_local_rank])/" \
    "$work/nanogpt/train.py"
diff <(cd "$NANOGPT_DIR" && cat train.py) "$work/nanogpt/train.py" | sed 's/^/patched: /' || true

model=(n_layer=4 n_head=4 n_embd=128 block_size=128 dropout=0.0 bias=False)
theirs() {
  (cd "$work/nanogpt" && OMP_NUM_THREADS=1 "$OLDPWD/.venv/bin/torchrun" --standalone --nproc_per_node=2 train.py \
    --dataset=fortunes --device=cpu --dtype=float32 --compile=False --backend=gloo --batch_size=16 \
    --gradient_accumulation_steps=2 --max_iters=$steps --lr_decay_iters=$steps --warmup_iters=10 \
    --learning_rate=1e-3 --min_lr=1e-4 --eval_interval=100000 --eval_iters=1 --log_interval=1 \
    --always_save_checkpoint=False --out_dir="$work/nanogpt_out" "${model[@]/#/--}" 2>&1) |
    $py -c "
import re, statistics, sys
t = [float(m.group(2)) for m in (re.search(r'iter (\d+): loss [\d.]+, time ([\d.]+)ms', l) for l in sys.stdin) if m and int(m.group(1)) >= $log]
print(2 * 16 * 128 / (statistics.median(t) / 1000))"
}
ours() {
  local out="$work/ours"
  rm -rf "$out"
  OMP_NUM_THREADS=1 "$build/ddp-launch" --nproc_per_node=2 "$build/worker" configs/gpt_fortunes_char.yaml \
    data.train_files="$work/data/fortunes/train.bin" data.val_files= model.vocab_size="$vocab" \
    model.n_layer=4 model.n_head=4 model.n_embd=128 model.block_size=128 model.bias=false \
    train.batch_size=16 train.max_steps=$steps train.warmup_steps=10 train.lr=1e-3 train.min_lr=1e-4 \
    train.betas='[0.9, 0.95]' train.weight_decay=0.1 train.fused=$([[ $fused == 1 ]] && echo true || echo false) \
    train.log_every=$log eval.enabled=false \
    output.dir="$out" >/dev/null 2>&1
  $py -c "
import json, statistics
r = [json.loads(l) for l in open('$out/metrics.jsonl')]
print(statistics.median(x['tokens_per_s'] for x in r if 'tokens_per_s' in x and x['step'] > $log))"
}

echo "GPT 4x4x128, block 128, 16 windows/rank, 2 ranks x 1 thread, fp32, $steps steps, vocab $vocab, fused AdamW: $fused"
printf '%-4s %14s %14s %7s\n' rep "ours tok/s" "nanoGPT tok/s" ratio
for ((i = 1; i <= reps; i++)); do
  if (( i % 2 )); then a=$(ours); b=$(theirs); else b=$(theirs); a=$(ours); fi
  printf '%-4s %14.0f %14.0f %6.2fx\n' "$i" "$a" "$b" "$($py -c "print($a / $b)")"
done
