#!/usr/bin/env bash
# Issue 44 (6): a model that DDP cannot fit under a per-rank memory limit trains with `full`
# (ddp::fullyShard). Every rank runs under the same RLIMIT_DATA (prlimit --data: since Linux 4.7
# it bounds the private writable mappings, i.e. the heap and every tensor; RLIMIT_AS is unusable
# with the CUDA wheel's address-space reservations, and this container has no cgroup memory
# controller of its own), so a rank that needs more gets ENOMEM from malloc: LibTorch's allocator
# throws, the rank aborts, and the launcher must end the job, not hang.
#
# Default: 16 MLP blocks of width 1024 and a head (fsdp_memory_bench's model, P = 135 349 248
# fp32 parameters), AdamW, 4 ranks, 2 GiB per rank. DDP's parameters + gradients + AdamW state
# alone are 16 P = 2065.3 MiB; `full` holds 16 P / 4 = 516.3 MiB, plus the full model each rank
# builds before sharding (4 P = 516.3 MiB, freed by fullyShard) and the gathered blocks.
#
#   bash bench/fsdp/memory_limit_demo.sh [build]
#   WORLD=4 WIDTH=1024 BLOCKS=16 STEPS=3 LIMIT_MB=2048 PYTORCH=1 bash bench/fsdp/memory_limit_demo.sh
#
# MALLOC_MMAP_THRESHOLD_=65536 on every run (as run.sh's memory rows): freed tensors go back to
# the kernel instead of staying in glibc's heap, where they would still count against the limit.
# Exits 0 when DDP failed with an out-of-memory error and `full` trained, on every side run.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
world=${WORLD:-4} width=${WIDTH:-1024} blocks=${BLOCKS:-16} steps=${STEPS:-3} limit_mb=${LIMIT_MB:-2048}
pytorch=${PYTORCH:-1}
bin=$build/bench/fsdp_memory_bench
[[ -x $bin ]] || { echo "memory_limit_demo: no $bin; cmake --build $build --target fsdp_memory_bench" >&2; exit 2; }
logs=$(mktemp -d /tmp/memory_limit_demo.XXXXXX)
limit=$((limit_mb << 20))

python3 - "$world" "$width" "$blocks" "$limit_mb" <<'EOF'
import sys
n, w, b, limit = map(int, sys.argv[1:])
P = b * (8 * w * w + 5 * w) + w * w + w
mib = lambda x: f"{x / 2**20:8.1f} MiB"
print(f"model: {b} blocks x + fc2(gelu(fc1(x))) of width {w} (4x wide) + head: P = {P:,} fp32 parameters")
print(f"limit per rank: RLIMIT_DATA {limit} MiB; {n} ranks")
print(f"  DDP  params + grads + AdamW (16 P)     {mib(16 * P)}")
print(f"  full params + grads + AdamW (16 P / N) {mib(16 * P / n)}")
print(f"  full: the model built before sharding  {mib(4 * P)}   one gathered block {mib(4 * (8 * w * w + 5 * w))}")
EOF
echo "logs: $logs"

status=0
# run NAME EXPECT(ok|oom) COMMAND...: the command under the limit; its result, exit status and what the user sees.
run() {
  local name=$1 expect=$2
  shift 2
  local log=$logs/$name.txt t0=$SECONDS
  MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=1 prlimit --data=$limit "$@" >"$log" 2>&1
  local rc=$? seconds=$((SECONDS - t0))
  local oom=no
  grep -q "can't allocate memory" "$log" && oom=yes
  echo
  echo "== $name: exit $rc after ${seconds} s, out-of-memory error: $oom (expected: $expect)"
  grep -o '{.*}' "$log" | head -1
  # What the user sees: the first error line of a rank, and the launcher's verdict.
  grep -m1 -E "what\(\):|RuntimeError" "$log" | cut -c1-220
  grep -m1 -E "^ddp-launch: rank [0-9]+ .*(killed|exited)|ChildFailedError|Root Cause" "$log" | cut -c1-220
  if [[ $expect == ok ]]; then
    [[ $rc -eq 0 ]] || status=1
  else
    [[ $rc -ne 0 && $oom == yes ]] || status=1
  fi
}

ours=("$build/ddp-launch" --nproc_per_node="$world" "$bin" --width "$width" --blocks "$blocks" --steps "$steps")
theirs=(.venv/bin/torchrun --standalone --nproc_per_node="$world" bench/fsdp/fsdp2_memory.py --width "$width"
        --blocks "$blocks" --steps "$steps")
run ours-ddp oom "${ours[@]}" --mode ddp
run ours-full ok "${ours[@]}" --mode full
if [[ $pytorch == 1 ]]; then
  run pytorch-ddp oom "${theirs[@]}" --mode ddp
  run pytorch-full ok "${theirs[@]}" --mode full
fi
echo
[[ $status == 0 ]] && echo "as expected: DDP ran out of memory under the limit, full trained $steps steps" \
                   || echo "NOT as expected: see $logs"
exit $status
