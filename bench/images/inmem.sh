#!/usr/bin/env bash
# In-memory image-folder decode (worker/data/image_folder.cc loadImageFolderSplit, data.stream=false):
# ours (the worker, 1 step, no evaluation: it decodes train/ only) vs torchvision_inmem.py on train/
# only (ImageFolder + Resize + PILToTensor through DataLoader, concatenated), 2 decode threads /
# workers, image_size 32, sides alternated, REPS
# pairs. Peak RSS from /usr/bin/time -v (ours) / getrusage (theirs). Prints one JSON line per run.
#   SET=DIR/folder bash bench/images/inmem.sh     # DIR from bench/images/make_images.py --layout folder
set -euo pipefail
cd "$(dirname "$0")/../.."
set=${SET:?set SET to an ImageFolder root with train/ and val/ (bench/images/make_images.py --out DIR: DIR/folder)}
reps=${REPS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ours() {
  local t0 t1 rss
  t0=$(date +%s.%N)
  OMP_NUM_THREADS=1 /usr/bin/time -v build/worker configs/fmnist_cnn_ddp.yaml mode=single threads=1 \
    data.name=image_folder data.root="$set" data.image_size=32 data.stream=false data.num_workers=2 \
    model.name=mlp 'model.hidden=[64]' train.max_steps=1 eval.enabled=false output.dir="$out/ours_run" \
    >"$out/ours.log" 2>&1 || { cat "$out/ours.log"; exit 1; }
  t1=$(date +%s.%N)
  rss=$(grep "Maximum resident" "$out/ours.log" | awk '{print $NF/1024}')
  echo "{\"side\": \"ours\", \"wall_s\": $(echo "$t1 - $t0" | bc), \"peak_rss_mb\": $rss}"
  rm -rf "$out/ours_run"
}
theirs() { OMP_NUM_THREADS=1 .venv/bin/python bench/images/torchvision_inmem.py "$set" 32 2 train; }
for ((i = 1; i <= reps; i++)); do
  if (( i % 2 )); then ours; theirs; else theirs; ours; fi
done
