#!/usr/bin/env bash
# Issue 44 (6): what each rank holds with DDP (none), ZeRO-1, ZeRO-2 and fully sharded training, ours
# (bench/fsdp/fsdp_memory_bench.cc under ddp-launch, shm) against PyTorch (fsdp2_memory.py under
# torchrun, Gloo: DDP, ZeroRedundancyOptimizer, FSDP2's fully_shard; zero2: fully_shard with
# reshard_after_forward=False, PyTorch's nearest, which frees after backward) on one model — 8 MLP blocks of
# width 768 (x + fc2(gelu(fc1(x))), 4x wide) and a head, 38.4 M parameters, AdamW, fp32, CPU — at
# world 2 and 4, in one run:
#   - the bytes of this rank's parameters + gradients + AdamW state (exact, from the tensors), beside
#     the formula: DDP 16 P, ZeRO-1 8 P + 8 P / N, ZeRO-2 4 P + 12 P / N, full 16 P / N (FSDP2's
#     padding aside);
#   - the resident memory training adds (the largest RSS sampled after each forward, backward and
#     step, less the RSS before the model), with MALLOC_MMAP_THRESHOLD_=65536 on both sides so that
#     freed tensors leave the RSS (glibc would otherwise keep the full model the sharding freed);
#   - the step time, from a second run without that setting, sides alternated.
#
#   WORLDS="2 4" MODES="ddp zero1 zero2 full" bash bench/fsdp/run.sh [build]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
worlds=${WORLDS:-"2 4"}
modes=${MODES:-"ddp zero1 zero2 full"}
py=.venv/bin/python
bin=$build/bench/fsdp_memory_bench
[[ -x $bin ]] || { echo "run.sh: no $bin; cmake --build $build --target fsdp_memory_bench" >&2; exit 2; }

ours() { OMP_NUM_THREADS=1 "$build/ddp-launch" --nproc_per_node="$1" "$bin" --mode "$2" 2>&1 | grep -o '{.*}'; }
theirs() { OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node="$1" bench/fsdp/fsdp2_memory.py --mode "$2" 2>/dev/null | grep -o '{.*}'; }

printf '%-5s %-6s %-8s %9s %9s %9s %10s %10s %12s %9s\n' world mode side "param MB" "grad MB" "optim MB" "sum MB" "formula" "train RSS MB" "step s"
for n in $worlds; do
  for mode in $modes; do
    for side in ours pytorch; do
      if [[ $side == ours ]]; then
        mem=$(MALLOC_MMAP_THRESHOLD_=65536 ours "$n" "$mode"); t=$(ours "$n" "$mode")
      else
        t=$(theirs "$n" "$mode"); mem=$(MALLOC_MMAP_THRESHOLD_=65536 theirs "$n" "$mode")
      fi
      $py - "$mem" "$t" "$n" "$mode" "$side" <<'EOF'
import json, sys
m, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
n, mode, side = int(sys.argv[3]), sys.argv[4], sys.argv[5]
P, MB = m["parameters"], 1024 * 1024
formula = {"ddp": 16 * P, "zero1": 8 * P + 8 * P / n, "zero2": 4 * P + 12 * P / n, "full": 16 * P / n}[mode] / MB
total = m["param_mb"] + m["grad_mb"] + m["optim_mb"]
print(f"{n:<5} {mode:<6} {side:<8} {m['param_mb']:9.1f} {m['grad_mb']:9.1f} {m['optim_mb']:9.1f} {total:10.1f} "
      f"{formula:10.1f} {m['train_rss_mb']:12.1f} {t['step_s']:9.3f}")
EOF
    done
  done
done
