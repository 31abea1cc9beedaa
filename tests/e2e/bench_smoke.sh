#!/usr/bin/env bash
# bench/ddp_bench under ddp-launch, as bench/run_ddp_bench.sh runs it, on a tiny MLP (784-64-10:
# 784*64 + 64 + 64*10 + 10 = 50 890 parameters, one bucket under the 1 MiB first-bucket cap), over
# Gloo and shm: the benchmark must keep running against the launcher and the library it measures.
#   bench_smoke.sh DDP_LAUNCH DDP_BENCH
set -euo pipefail
launch=$1 bench=$2
export OMP_NUM_THREADS=1
for backend in gloo shm; do
  out=$(DDP_BENCH_BACKEND=$backend "$launch" --nproc_per_node=2 "$bench" overlap 64 8 3 2>&1) || {
    echo "$out"; echo "bench_smoke: ddp_bench overlap failed on $backend" >&2; exit 1; }
  echo "$out"
  # nlohmann::json prints keys sorted: ... "backend", "bench", "buckets", ... "params", "world".
  grep -Eq "\"backend\":\"$backend\",\"bench\":\"overlap\",\"buckets\":1,.*\"params\":50890,\"world\":2" <<<"$out" || {
    echo "bench_smoke: no overlap line with 1 bucket, 50890 parameters, world 2 on $backend" >&2; exit 1; }
done
out=$("$launch" --nproc_per_node=2 "$bench" nonsense 2>&1) && { echo "$out"; echo "bench_smoke: a bad mode exited 0" >&2; exit 1; }
grep -q "usage: ddp_bench" <<<"$out" || { echo "$out"; echo "bench_smoke: no usage line for a bad mode" >&2; exit 1; }
echo "bench_smoke: ok"
