#!/usr/bin/env bash
# ZeRO stage 1 memory on the CPU (train.zero): the optimizer state each rank holds and each rank's peak
# RSS, for AdamW on a ~24 M-parameter Fashion-MNIST MLP (784-4096-4096-1024-10), ours unsharded
# (train.zero=false) and sharded (train.zero=true: ddp::ZeroRedundancyOptimizer), beside Python PyTorch
# DDP with plain torch.optim.AdamW and with torch.distributed.optim.ZeroRedundancyOptimizer
# (bench/whole_job/python_ddp_job.py, PY_JOB_OPTIMIZER=adamw, PY_JOB_ZERO 0 / 1). NPROC ranks, per-rank
# batch 16, STEPS optimizer steps (AdamW's state exists from the first step on), ours without evaluation
# (the Python job always evaluates the test set, in batches of 100). Memory only: no timings are kept.
# Ours: summary.json's optimizer_state_mb_per_process and peak_rss_mb_per_process; Python: its JSON
# line's optimizer_state_bytes_per_process (tensor nbytes in optimizer.state, for ZeRO in
# zero.optim.state) and peak_rss_mb_per_process (getrusage ru_maxrss), all per rank.
# Writes bench/zero/RESULTS.md and raw_last.jsonl.
#   bash bench/zero/run.sh                           # build/, 4 ranks, backend auto, 3 steps
#   NPROC=2 STEPS=2 HIDDEN=2048,2048 bash bench/zero/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
nproc=${NPROC:-4}
steps=${STEPS:-3}
batch=${BATCH:-16}
hidden=${HIDDEN:-4096,4096,1024}
backend=${BACKEND:-auto}
root=/usr/share/datasets/fashion-mnist
python=.venv/bin/python
torchrun=.venv/bin/torchrun
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
raw=bench/zero/raw_last.jsonl
: >"$raw"
model_hidden="[${hidden//,/, }]"  # 4096,4096,1024 -> [4096, 4096, 1024]

for zero in false true; do
  "$build/ddp-launch" --nproc_per_node="$nproc" "$build/worker" configs/fmnist_cnn_ddp.yaml \
    backend="$backend" model.name=mlp "model.hidden=$model_hidden" train.optimizer=adamw \
    train.batch_size="$batch" train.max_steps="$steps" eval.enabled=false train.zero="$zero" \
    output.dir="$scratch/ours" >"$scratch/ours.log" 2>&1 || { tail -n 20 "$scratch/ours.log"; exit 1; }
  "$python" - "$scratch/ours/summary.json" >>"$raw" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"side": "ours", "zero": s["zero"], "ranks": s["world_size"], "steps": s["steps"],
                  "backend": s.get("backend"),
                  "optimizer_state_mb_per_process": s["optimizer_state_mb_per_process"],
                  "peak_rss_mb_per_process": s["peak_rss_mb_per_process"]}))
PY
  tail -n 1 "$raw"
done

for zero in 0 1; do
  PY_JOB_OUT="$scratch/python" PY_JOB_MODEL=mlp PY_JOB_HIDDEN="$hidden" PY_JOB_OPTIMIZER=adamw \
    PY_JOB_ZERO="$zero" PY_JOB_MAX_STEPS="$steps" PY_JOB_BATCH="$batch" OMP_NUM_THREADS=1 \
    "$torchrun" --standalone --nproc_per_node="$nproc" bench/whole_job/python_ddp_job.py "$root" \
    >"$scratch/python.log" 2>&1 || { tail -n 20 "$scratch/python.log"; exit 1; }
  "$python" - "$scratch/python.log" "$nproc" >>"$raw" <<'PY'
import json, sys
py = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
print(json.dumps({"side": "python", "zero": py["zero"], "ranks": int(sys.argv[2]), "steps": py["steps"],
                  "backend": "gloo", "parameters": py["parameters"],
                  "optimizer_state_mb_per_process": [b / 2**20 for b in py["optimizer_state_bytes_per_process"]],
                  "optimizer_state_bytes_per_process": py["optimizer_state_bytes_per_process"],
                  "peak_rss_mb_per_process": py["peak_rss_mb_per_process"]}))
PY
  tail -n 1 "$raw"
done

"$python" - "$raw" "$build" "$nproc" "$steps" "$batch" "$hidden" "$backend" >bench/zero/RESULTS.md <<'PY'
import json, subprocess, sys
sys.path.insert(0, "bench/whole_job")
from python_ddp_job import Mlp  # the same layers as our "mlp"
raw, build, nproc, steps, batch, hidden, backend = sys.argv[1:8]
rows = [json.loads(l) for l in open(raw)]
widths = [int(w) for w in hidden.split(",")]
net = Mlp(hidden=widths)
sizes = [p.numel() for p in net.parameters()]
largest = max(net.named_parameters(), key=lambda np: np[1].numel())[0]
params = sum(sizes)
full_mb = 2 * 4 * params / 2**20
# PyTorch's greedy partition (ours copies it): largest parameters first, each to the rank with the
# fewest elements so far; AdamW keeps exp_avg and exp_avg_sq (fp32) per element.
load = [0] * int(nproc)
for n in sorted(sizes, reverse=True):
    load[load.index(min(load))] += n
shard_mb = sorted(2 * 4 * n / 2**20 for n in load)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
torch_version = subprocess.run([".venv/bin/python", "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True).stdout.strip()
hidden_cfg = "[" + ", ".join(map(str, widths)) + "]"
print("# ZeRO stage 1 on the CPU: optimizer state and peak RSS per rank, ours vs Python\n")
print(f"`bash bench/zero/run.sh` ({build}/, {nproc} ranks, ours over backend {backend} "
      f"({rows[0].get('backend')}), Python DDP over gloo, Python torch {torch_version}), on {cpu}, "
      f"{__import__('os').cpu_count()} cores. Model: mlp 784-{'-'.join(map(str, widths))}-10, "
      f"{params:,} parameters ({len(sizes)} tensors), AdamW (lr 0.05, betas (0.9, 0.999), eps 1e-8, "
      f"weight decay 0), per-rank batch {batch}, {steps} optimizer steps. Memory only (the machine was "
      "busy, no timings).\n")
print("Ours: `" + f"{build}/ddp-launch --nproc_per_node={nproc} {build}/worker configs/fmnist_cnn_ddp.yaml "
      f"backend={backend} model.name=mlp \"model.hidden={hidden_cfg}\" train.optimizer=adamw "
      f"train.batch_size={batch} train.max_steps={steps} eval.enabled=false train.zero=false|true` "
      "(summary.json: optimizer_state_mb_per_process, peak_rss_mb_per_process).\n")
print("Python: `" + f"PY_JOB_MODEL=mlp PY_JOB_HIDDEN={hidden} PY_JOB_OPTIMIZER=adamw PY_JOB_ZERO=0|1 "
      f"PY_JOB_MAX_STEPS={steps} PY_JOB_BATCH={batch} OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone "
      f"--nproc_per_node={nproc} bench/whole_job/python_ddp_job.py /usr/share/datasets/fashion-mnist` "
      "(ZeRO: `ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.05, ...)`; "
      "optimizer state = nbytes of the tensors in optimizer.state, for ZeRO in zero.optim.state; peak RSS "
      "= getrusage(RUSAGE_SELF).ru_maxrss / 1024 at the end of the job, after its test-set evaluation).\n")
print("| run | optimizer state MiB per rank (rank 0..N-1) | largest rank vs unsharded | "
      "sum over ranks | peak RSS MiB, max (per rank) | vs unsharded: max (per rank) |")
print("|---|---|---|---|---|---|")
for side in ("ours", "python"):
    base = next((r for r in rows if r["side"] == side and not r["zero"]), None)
    for r in (x for x in rows if x["side"] == side):
        opt, rss = r["optimizer_state_mb_per_process"], r["peak_rss_mb_per_process"]
        name = f"{side} {'ZeRO-1' if r['zero'] else 'unsharded'}"
        if r["zero"] and base:
            red = f"{max(base['optimizer_state_mb_per_process']) / max(opt):.2f}x less"
            deltas = [a - b for a, b in zip(rss, base["peak_rss_mb_per_process"])]
            rss_vs = (f"{max(rss) - max(base['peak_rss_mb_per_process']):+.0f} MiB "
                      f"({', '.join(f'{d:+.0f}' for d in deltas)})")
        else:
            red, rss_vs = "1.00x", "-"
        print(f"| {name} | {', '.join(f'{m:.1f}' for m in opt)} | {red} | {sum(opt):.1f} | "
              f"{max(rss):.0f} ({', '.join(f'{m:.0f}' for m in rss)}) | {rss_vs} |")
print(f"\nFormula check: the full AdamW state is 2 (exp_avg, exp_avg_sq) x 4 bytes x {params:,} parameters "
      f"= {2 * 4 * params:,} bytes = {full_mb:.1f} MiB per rank unsharded; with ZeRO the ranks' shards "
      f"sum to that. The parameter-granular greedy partition (largest tensor first, to the least-loaded "
      f"rank; PyTorch's and ours) predicts shards of {', '.join(f'{m:.1f}' for m in shard_mb)} MiB "
      f"(sorted): the {max(sizes):,}-element {largest} alone is one rank's shard, so the largest rank "
      f"keeps {max(shard_mb) / full_mb:.0%} of the state and saves only {full_mb / max(shard_mb):.2f}x, not "
      f"{nproc}x; an even split would be {full_mb / int(nproc):.1f} MiB each. Python's AdamW also keeps a "
      "4-byte float32 \"step\" tensor per parameter tensor (in the bytes above; LibTorch's step is a "
      "plain integer).")
print("\nPeak RSS is the whole process's high-water mark (libraries, the Fashion-MNIST copy each rank "
      "loads, parameters, gradients, DDP buckets, the optimizer state, the step's temporaries, and for "
      "Python its evaluation; our rank 0 also exports model.pt), one run each: compare within a side, "
      "not across. Per rank, ZeRO's RSS drop is to be set beside the state that rank no longer holds "
      "(unsharded minus its shard):")
for side in ("ours", "python"):
    base = next((r for r in rows if r["side"] == side and not r["zero"]), None)
    z = next((r for r in rows if r["side"] == side and r["zero"]), None)
    if base and z:
        dropped = [a - b for a, b in zip(base["optimizer_state_mb_per_process"], z["optimizer_state_mb_per_process"])]
        rss = [a - b for a, b in zip(base["peak_rss_mb_per_process"], z["peak_rss_mb_per_process"])]
        print(f"- {side}: state dropped {', '.join(f'{d:.0f}' for d in dropped)} MiB; "
              f"peak RSS lower by {', '.join(f'{d:.0f}' for d in rss)} MiB "
              f"(RSS drop minus state dropped: {', '.join(f'{b - a:+.0f}' for a, b in zip(dropped, rss))} MiB).")
print("\nWhere the RSS drop clearly exceeds the state dropped (Python's ranks when this was written), the "
      "likely rest is the step's temporaries: PyTorch's single-tensor AdamW (the CPU default) allocates "
      "`exp_avg_sq.sqrt() / bias_correction2_sqrt` per parameter it steps, so a rank that no longer steps "
      "the largest tensor no longer allocates two temporaries its size.")
PY
cat bench/zero/RESULTS.md
