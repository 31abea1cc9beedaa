#!/usr/bin/env bash
# The GPU bench's Python tools, checked on the CPU so that lent GPU time is not lost to them:
# - python_gpu_reference.py --dry-run: both loaders (index_select gather, DataLoader with 2 worker
#   processes) give the same batches, hence the same loss after the same 2 steps;
# - trace_summary.py on a made-up trace of 2 steps whose ProfilerStep spans Kineto also copied onto
#   2 GPU streams: 2 steps, 3 kernel launches over 2 steps = 1.5 per step, 2 ops per step;
# - make_table.py on the committed H100 lines: CNN b64 fp32's ratio is reducer_on 53 759.9 over the
#   better Python eager 36 013.9 = 1.49.
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
echo "bench_gpu_tools: ok"
