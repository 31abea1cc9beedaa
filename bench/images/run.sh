#!/usr/bin/env bash
# Issue 43 (5): streamed images, our loader (ddp::ImageLoader, bench/images/image_loader_bench.cc)
# against torchvision.datasets.ImageFolder + DataLoader(num_workers=N) (bench/images/
# torchvision_loader.py) on the same JPEG files, the ImageNet training transform at 224, batches of
# 64, the same number of loader threads / worker processes, sides alternated, in one run:
#   1. images/s (and per loader thread) from the folder, for each THREADS value, against each of
#      DECODERS: torchvision's Pillow path (pil) and its tensor path (tensor: decode_image + v2 on
#      uint8, its transforms docs' advice for speed);
#   2. ours from the tar shards of the same pictures;
#   3. peak RSS and the time to the first batch with 10 000 and with 100 000 files (the larger set:
#      hard links to the pictures under new names, made once; the loaders index and read them alike).
#
#   BENCH_DIR=/tmp/ddp_images_bench TRAIN=50000 REPS=3 THREADS="1 2" BATCHES=60 \
#   PARTS="loader tar rss train" bash bench/images/run.sh [build]
#
# The pictures (bench/images/make_images.py, from Debian's Fashion-MNIST: ~400 x 350, JPEG q90) are
# made under BENCH_DIR/set once (about 25 min for 50 000 on 2 cores) and reused.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
dir=${BENCH_DIR:-/tmp/ddp_images_bench}
train=${TRAIN:-50000}
reps=${REPS:-3}
threads=${THREADS:-"1 2"}
batches=${BATCHES:-60}
parts=" ${PARTS:-loader tar rss train} "
decoders=${DECODERS:-"pil tensor"}
py=.venv/bin/python
ours_bin=$build/bench/image_loader_bench
[[ -x $ours_bin ]] || { echo "run.sh: no $ours_bin; cmake --build $build --target image_loader_bench" >&2; exit 2; }

if [[ ! -d $dir/set/folder/train ]]; then
  $py bench/images/make_images.py --out "$dir/set" --train "$train" --val 1000 --layout both
fi

# Sets of N file names under one root (hard links: no extra bytes), for the RSS rows.
linked_set() {
  local n=$1 out=$dir/linked_$1
  if [[ ! -d $out ]]; then
    mkdir -p "$out"
    $py - "$dir/set/folder/train" "$out" "$n" <<'EOF'
import os, sys
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = sorted(os.path.join(c, f) for c in os.listdir(src) for f in os.listdir(os.path.join(src, c)))
for i in range(n):
    rel = files[i % len(files)]
    cls = os.path.dirname(rel)
    os.makedirs(os.path.join(out, cls), exist_ok=True)
    os.link(os.path.join(src, rel), os.path.join(out, cls, f"{i:07d}_{os.path.basename(rel)}"))
EOF
  fi
  echo "$out"
}

field() { $py -c "import json, sys; print(json.loads(sys.argv[1])['$1'])" "$2"; }
ours() { OMP_NUM_THREADS=1 "$ours_bin" "$1" --threads "$2" --batches "$batches"; }
theirs() { OMP_NUM_THREADS=1 $py bench/images/torchvision_loader.py "$1" --workers "$2" --batches "$batches" --decoder "${3:-pil}"; }

if [[ $parts == *" loader "* ]]; then
echo "images/s, ImageNet training transform at 224, batches of 64, $batches timed batches after 5 (files: $dir/set)"
printf '%-4s %-8s %-8s %12s %14s %7s\n' rep threads decoder "ours img/s" "torchvision" ratio
for t in $threads; do
  for d in $decoders; do
    for ((i = 1; i <= reps; i++)); do
      if (( i % 2 )); then a=$(ours "$dir/set/folder/train" "$t"); b=$(theirs "$dir/set/folder/train" "$t" "$d")
      else b=$(theirs "$dir/set/folder/train" "$t" "$d"); a=$(ours "$dir/set/folder/train" "$t"); fi
      ra=$(field images_per_s "$a"); rb=$(field images_per_s "$b")
      printf '%-4s %-8s %-8s %12.0f %14.0f %6.2fx\n' "$i" "$t" "$d" "$ra" "$rb" "$($py -c "print($ra / $rb)")"
    done
  done
done

fi

if [[ $parts == *" tar "* ]]; then
echo
echo "ours from the tar shards of the same pictures:"
for t in $threads; do
  r=$(ours "$dir/set/tar/train-*.tar" "$t")
  printf '  threads %s: %.0f images/s\n' "$t" "$(field images_per_s "$r")"
done

fi

if [[ $parts == *" rss "* ]]; then
echo
echo "peak RSS and time to the first batch, 2 loader threads, by the number of files:"
printf '%-8s %-12s %12s %16s\n' files side "peak RSS MB" "first batch s"
for n in 10000 100000; do
  root=$(linked_set $n)
  a=$(ours "$root" 2); b=$(theirs "$root" 2)
  printf '%-8s %-12s %12.0f %16.2f\n' $n ours "$(field peak_rss_mb "$a")" "$(field first_batch_s "$a")"
  printf '%-8s %-12s %12.0f %16.2f\n' $n torchvision "$(field peak_rss_mb "$b")" "$(field first_batch_s "$b")"
done

fi

# Training: resnet18 at TRAIN_SIZE on 2 CPU ranks, batches of 32 per rank, SGD, the streamed folder
# with the ImageNet transform and 1 loader thread / worker per rank: ours (the worker) vs torchvision
# under torchrun + DDP (bench/images/torchvision_train.py), both over Gloo; ours logs every 5 steps (a
# loss all-reduce and a host wait per logged step, which the reference does not make), so TRAIN_STEPS
# is a multiple of 5.
size=${TRAIN_SIZE:-112}
steps=${TRAIN_STEPS:-30}
[[ $parts == *" train "* ]] || exit 0
(( steps % 5 == 0 )) || { echo "TRAIN_STEPS must be a multiple of 5 (ours logs every 5 steps)" >&2; exit 2; }
echo
echo "training resnet18 at ${size}px, 2 ranks x 32, SGD, fp32, 1 loader thread per rank ($steps steps after 5):"
printf '%-4s %12s %14s %7s\n' rep "ours img/s" "torchvision" ratio
train_ours() {
  local out=$dir/train_out
  rm -rf "$out"
  "$build/ddp-launch" --nproc_per_node=2 "$build/worker" configs/imagenet_resnet50.yaml model.name=resnet18 \
    data.root="$dir/set/folder" data.image_size="$size" data.num_workers=1 train.batch_size=32 \
    train.precision=fp32 train.channels_last=false train.max_steps=$((steps + 5)) train.log_every=5 \
    backend=gloo eval.enabled=false checkpoint.every_steps=0 output.dir="$out" >/dev/null 2>&1
  $py -c "
import json
r = {x['step']: x for x in map(json.loads, open('$out/metrics.jsonl')) if 'samples' in x}
a, b = r[5], r[max(r)]  # as the reference: the images after step 5 over their time
print((b['samples'] - a['samples']) / (b['elapsed_s'] - a['elapsed_s']))"
}
train_theirs() {
  OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 bench/images/torchvision_train.py \
    "$dir/set/folder/train" --workers 1 --size "$size" --steps "$steps" 2>/dev/null | tail -1 |
    $py -c "import json, sys; print(json.loads(sys.stdin.read())['images_per_s'])"
}
for ((i = 1; i <= reps; i++)); do
  if (( i % 2 )); then a=$(train_ours); b=$(train_theirs); else b=$(train_theirs); a=$(train_ours); fi
  printf '%-4s %12.1f %14.1f %6.2fx\n' "$i" "$a" "$b" "$($py -c "print($a / $b)")"
done
