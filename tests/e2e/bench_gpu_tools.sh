#!/usr/bin/env bash
# The GPU bench's Python tools, checked on the CPU so that lent GPU time is not lost to them:
# - python_gpu_reference.py --dry-run: both loaders (index_select gather, DataLoader with 2 worker
#   processes) give the same batches, hence the same loss after the same 2 steps;
# - trace_summary.py on a made-up trace of 2 steps whose ProfilerStep spans Kineto also copied onto
#   2 GPU streams: 2 steps, 3 kernel launches over 2 steps = 1.5 per step, 2 ops per step;
# - make_table.py on the committed H100 lines: CNN b64 fp32's ratio is reducer_on 53 759.9 over the
#   better Python eager 36 013.9 = 1.49;
# - bench/gpt/gpu_record.py on a made-up nanoGPT log (walls 0, 1, 3, 4, 6 s at iters 20..60, LOG 10,
#   SKIP 30: windows 30-40, 40-50, 50-60 of 2, 1, 2 s, 10 x 12 x 1024 tokens each: median 61 440
#   tokens/s) and a made-up output.dir of ours (median of steps > 30: 50 000), and gpu_table.py's
#   ratio of the two, 0.81, with nanoGPT's MFU scaled by it (50 % x 61 440 / 50 000 = 61.4 %).
#   bench_gpu_tools.sh PYTHON
set -euo pipefail
py=$1
cd "$(dirname "$0")/../.."
fail() { echo "bench_gpu_tools: $*" >&2; exit 1; }

loss() {  # loader -> final_loss of a dry run
  local out
  out=$("$py" bench/gpu/python_gpu_reference.py --model cnn --batch 64 --variant ddp_fused --dry-run --loader "$1" 2>&1) ||
    { echo "$out"; fail "dry run with --loader $1 failed"; }
  echo "$out" >&2
  "$py" -c 'import json, sys; d = json.loads(sys.argv[1].splitlines()[-1]); assert d["loader"] == sys.argv[2], d; print(d["final_loss"])' "$out" "$1"
}
gather=$(loss gather) dataloader=$(loss dataloader)
[ "$gather" = "$dataloader" ] || fail "the loaders trained differently: final loss $gather (gather) vs $dataloader (dataloader)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" - "$tmp/trace.json" <<'PY'
import json, sys
ev = []
for k, t0 in enumerate((0, 1000)):
    step = f"ProfilerStep#{k}"
    ev.append({"ph": "X", "cat": "user_annotation", "name": step, "ts": t0, "dur": 900, "pid": 1, "tid": 1})
    for stream in (7, 49):  # Kineto's copies on the GPU streams, later and longer than the host span
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": step, "ts": t0 + 50, "dur": 2000, "pid": 0, "tid": stream})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t0 + 10, "dur": 100, "pid": 1, "tid": 1})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::add_", "ts": t0 + 200, "dur": 50, "pid": 1, "tid": 1})
    for j in range(1 + k):  # 1 launch in step 0, 2 in step 1
        c = 10 * k + j
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 20 + j, "dur": 5, "pid": 1,
                   "tid": 1, "args": {"correlation": c}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "ts": t0 + 300, "dur": 40, "pid": 0, "tid": 7,
                   "args": {"correlation": c}})
json.dump({"traceEvents": ev}, open(sys.argv[1], "w"))
PY
summary=$("$py" bench/gpu/trace_summary.py made_up="$tmp/trace.json" | tail -1)
"$py" -c '
import json, sys
d = json.loads(sys.argv[1])
want = {"steps": 2, "step_us": 900.0, "cpu_ops_per_step": 2.0, "kernel_launches_per_step": 1.5, "gpu_ops_per_step": 1.5}
bad = {k: (d[k], v) for k, v in want.items() if d[k] != v}
sys.exit(f"trace_summary: got (value, expected) {bad}" if bad else 0)' "$summary" || fail "trace_summary.py miscounts the made-up trace"

table=$("$py" bench/gpu/make_table.py bench/gpu/results_h100_2026-11-26_run1.jsonl)
grep -E '^\| CNN \| 64 \| fp32 \|' <<<"$table" | grep -q '| 1.49× |' || { echo "$table"; fail "make_table.py: CNN b64 fp32 is not 1.49x"; }
mkdir -p "$tmp/ours"
printf '%s\n' 'iter 20: loss 9.0000, time 1.00ms, mfu -100.00%, wall 0.000000' \
  'iter 30: loss 8.0000, time 1.00ms, mfu 1.00%, wall 1.000000' 'iter 40: loss 7.0000, time 1.00ms, mfu 1.00%, wall 3.000000' \
  'iter 50: loss 6.0000, time 1.00ms, mfu 1.00%, wall 4.000000' 'iter 60: loss 5.5000, time 1.00ms, mfu 1.00%, wall 6.000000' \
  'peak_allocated_mb 1234.5' > "$tmp/nanogpt.log"
printf '%s\n' '{"step": 30, "tokens_per_s": 1, "mfu": 0.9}' '{"step": 40, "tokens_per_s": 40000, "mfu": 0.4}' \
  '{"step": 50, "tokens_per_s": 50000, "mfu": 0.5}' '{"step": 60, "tokens_per_s": 70000, "mfu": 0.7}' > "$tmp/ours/metrics.jsonl"
echo '{"final_loss": 5.25, "cuda_peak_allocated_mb_per_device": [987.0]}' > "$tmp/ours/summary.json"
{
  echo '{"bench": "gpt_gpu", "kind": "env", "gpu": "made up", "torch": "0", "steps": 60, "log": 10, "skip": 30, "batch": 12, "block": 1024, "model": "m", "dtype": "bfloat16"}'
  "$py" bench/gpt/gpu_record.py ours eager 1 "$tmp/ours" 0 5 30 10 12 1024
  "$py" bench/gpt/gpu_record.py nanogpt eager 1 "$tmp/nanogpt.log" 0 5 30 10 12 1024
  "$py" bench/gpt/gpu_record.py nanogpt compile 1 "$tmp/missing.log" 124 5 30 10 12 1024
} > "$tmp/gpt.jsonl"
"$py" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ours, theirs, failed = rows[1], rows[2], rows[3]
want = [(ours["tokens_per_s"], 50000), (ours["mfu"], 0.5), (ours["peak_mb"], 987.0), (theirs["tokens_per_s"], 61440.0),
        (theirs["peak_mb"], 1234.5), (theirs["final_loss"], 5.5), ("failed" in failed, True)]
bad = [w for w in want if w[0] != w[1]]
sys.exit(f"gpu_record: (got, expected) {bad}" if bad else 0)' "$tmp/gpt.jsonl" || fail "gpu_record.py misreads the made-up runs"
gpt_table=$("$py" bench/gpt/gpu_table.py "$tmp/gpt.jsonl")
grep -F '| ours eager vs nanoGPT eager (target >= 1.1x) | 1 | 50,000 | 61,440 | 0.81× | 50.0% | 61.4% | 987 | 1,234 |' <<<"$gpt_table" >/dev/null ||
  { echo "$gpt_table"; fail "gpu_table.py: the eager row is not 50 000 / 61 440 = 0.81x, MFU 50.0% and 50.0 x 61 440 / 50 000 = 61.4%"; }
echo "bench_gpu_tools: ok"
