#!/usr/bin/env bash
# docs/fully_sharded.md's "Measured" table: the worker's GPT (4 layers, 4 heads, 256 wide, block 64,
# char-level fortunes, AdamW, 10 steps) on 2 ranks over shm with each train.sharding, in one run;
# per rank the bytes of parameters, gradients and AdamW state and the peak RSS from summary.json,
# samples/s, the validation loss, and each export's largest difference from the `none` run's.
#
#   bash bench/fsdp/worker_sharding.sh [build]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
py=.venv/bin/python
out=$(mktemp -d /tmp/ddp_worker_sharding_XXXXXX)
trap 'rm -rf "$out"' EXIT
$py scripts/prepare_text.py $(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort) \
  --out "$out/data" --level char > /dev/null
for mode in none zero1 zero2 full; do
  "$build/ddp-launch" --nproc_per_node=2 "$build/worker" configs/gpt_fortunes_char.yaml \
    "data.train_files=$out/data/train_*.bin" "data.val_files=$out/data/val_*.bin" \
    model.n_embd=256 model.block_size=64 train.max_steps=10 eval.interval=0 \
    "output.dir=$out/$mode" "train.sharding=$mode" > "$out/$mode.log" 2>&1 ||
    { tail -5 "$out/$mode.log" >&2; exit 1; }
done
$py - "$out" <<'PY'
import json, sys, torch
out = sys.argv[1]
ref = torch.load(f"{out}/none/model.pt", map_location="cpu")
print("| `train.sharding` | parameter bytes per rank | gradient bytes per rank | AdamW state bytes, rank 0 / 1 "
      "| peak RSS MB, rank 0 / 1 | samples/s | val_loss | export vs `none`, max abs difference |")
print("|---|---|---|---|---|---|---|---|")
b = lambda mb: f"{round(mb * 1024 * 1024):,}".replace(",", " ")
for mode in ["none", "zero1", "zero2", "full"]:
    s = json.load(open(f"{out}/{mode}/summary.json"))
    sd = torch.load(f"{out}/{mode}/model.pt", map_location="cpu")
    assert sd.keys() == ref.keys(), mode
    diff = max((sd[k].double() - ref[k].double()).abs().max().item() for k in ref)
    p, g, o, r = (s[k] for k in ["parameter_mb_per_process", "gradient_mb_per_process",
                                 "optimizer_state_mb_per_process", "peak_rss_mb_per_process"])
    same = lambda v: b(v[0]) if v[0] == v[1] else f"{b(v[0])} / {b(v[1])}"
    print(f"| `{mode}` | {same(p)} | {same(g)} | {b(o[0])} / {b(o[1])} | {r[0]:.1f} / {r[1]:.1f} "
          f"| {s['samples_per_s']:.0f} | {s['val_loss']:.4f} | {diff:.1e} |")
PY
