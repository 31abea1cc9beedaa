#!/usr/bin/env bash
# Issue 44 (6): where a `full` step's time goes, ours (ddp::fullyShard over shm) against PyTorch's
# FSDP2 (Gloo), on fsdp_memory_bench's model at world 2 (and 4), sides alternated, R runs each
# (ours over shm, the default on one host, and over Gloo, PyTorch's transport):
#   1. wall time: fsdp_step_breakdown (ours) and fsdp2_step_breakdown.py (PyTorch) print the step
#      split into forward / backward / optimizer and one block's parts (unshard+reshard, all-gather,
#      reduce-scatter, the all-reduce of world x S, copy-in, allocation, the block's compute); the
#      medians over the runs are printed as one table;
#   2. with PERF=1, CPU time: one `perf record --call-graph dwarf` run of fsdp_memory_bench --mode full
#      per side, split by bench/fsdp/step_profile.py into compute / optimizer / collective /
#      fallback / copy-in / copy-out / other, with the kernel's page-fault share.
#
#   WORLDS="2 4" RUNS=3 PERF=1 bash bench/fsdp/step_profile.sh [build]
# The machine's load (uptime) is printed before each run: compare only runs on a quiet machine.
# Before/after a library change in one run: BEFORE=<the old libddp.so.X.Y.Z> adds ours with that
# library (LD_PRELOAD in the ranks: the binaries' RPATH wins over LD_LIBRARY_PATH) as two more sides,
# alternated with the others, and the table gets after/before columns:
#   mkdir /tmp/ddp_before && cp -a build/libddp.so* /tmp/ddp_before/   # before the change; rebuild
#   BEFORE=/tmp/ddp_before/libddp.so.0.1.0 WORLDS=2 RUNS=5 bash bench/fsdp/step_profile.sh build
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
worlds=${WORLDS:-2} runs=${RUNS:-3} perf=${PERF:-0} before=${BEFORE:-}
bin=$build/bench/fsdp_step_breakdown
[[ -x $bin ]] || { echo "step_profile: no $bin; cmake --build $build --target fsdp_step_breakdown" >&2; exit 2; }
out=$(mktemp -d /tmp/step_profile.XXXXXX)
echo "results: $out"
export OMP_NUM_THREADS=1
for n in $worlds; do
  for i in $(seq "$runs"); do
    sides="shm gloo pytorch"
    [[ -z $before ]] || sides="shm-before shm gloo-before gloo pytorch"
    for side in $sides; do
      echo "world $n run $i $side: load $(cut -d' ' -f1-3 /proc/loadavg)"
      if [[ $side == *-before ]]; then
        "$build/ddp-launch" --nproc_per_node="$n" /usr/bin/env LD_PRELOAD="$before" "$bin" --backend "${side%-before}" 2>&1 |
          grep -o '{.*}' | sed 's/^{/{"lib": "before", /' >>"$out/breakdown.jsonl"
      elif [[ $side != pytorch ]]; then
        "$build/ddp-launch" --nproc_per_node="$n" "$bin" --backend "$side" 2>&1 | grep -o '{.*}' >>"$out/breakdown.jsonl"
      else
        (cd bench/fsdp && ../../.venv/bin/torchrun --standalone --nproc_per_node="$n" fsdp2_step_breakdown.py 2>/dev/null) |
          grep -o '{.*}' >>"$out/breakdown.jsonl"
      fi
    done
  done
done
.venv/bin/python - "$out/breakdown.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = ["forward", "backward", "optimizer", "unshard_reshard", "all_gather", "reduce_scatter", "all_reduce_world_x_S",
        "copy_in", "alloc_first_touch", "fill_reused", "block_fwd_bwd"]
def side(r):
    if r["side"] != "ours":
        return "PyTorch FSDP2"
    return "ours " + r["backend"] + (" (before)" if r.get("lib") == "before" else "")
ab = any(r.get("lib") == "before" for r in rows)
sides = (["ours shm (before)", "ours shm", "ours gloo (before)", "ours gloo"] if ab else ["ours shm", "ours gloo"]) + \
    ["PyTorch FSDP2"]
ratios = ([("shm after / before", "ours shm", "ours shm (before)"), ("gloo after / before", "ours gloo", "ours gloo (before)")]
          if ab else []) + [("ours shm / FSDP2", "ours shm", "PyTorch FSDP2")]
for world in sorted({r["world"] for r in rows}):
    med = {s: {k: statistics.median(r[k] for r in rows if r["world"] == world and side(r) == s) for k in keys}
           for s in sides}
    n = sum(1 for r in rows if r["world"] == world and side(r) == "ours shm")
    print(f"\nworld {world}, median of {n} runs each (ms)")
    print("| part | " + " | ".join(sides + [q[0] for q in ratios]) + " |\n" + "|---" * (1 + len(sides) + len(ratios)) + "|")
    for k in keys + ["step"]:
        v = {s: sum(med[s][x] for x in keys[:3]) if k == "step" else med[s][k] for s in sides}
        print(f"| {k} | " + " | ".join(f"{v[s] * 1e3:.1f}" for s in sides) + " | " +
              " | ".join(f"{v[a] / v[b]:.2f}" for _, a, b in ratios) + " |")
EOF
if [[ $perf == 1 ]]; then
  for side in ours pytorch; do
    if [[ $side == ours ]]; then
      cmd=("$build/ddp-launch" --nproc_per_node=2 "$build/bench/fsdp_memory_bench" --mode full --steps 8)
    else
      cmd=(.venv/bin/torchrun --standalone --nproc_per_node=2 bench/fsdp/fsdp2_memory.py --mode full --steps 8)
    fi
    perf record -q -F 499 --call-graph dwarf,8192 -o "$out/$side.data" -- "${cmd[@]}" 2>/dev/null | grep -o '{.*}' || true
    perf script --no-inline -i "$out/$side.data" -F comm,pid,tid,time,ip,sym,dso 2>/dev/null >"$out/$side.txt"
    rm -f "$out/$side.data"
  done
  python3 bench/fsdp/step_profile.py --hz 499 --steps 8 "$out/ours.txt" vs "$out/pytorch.txt"
fi
