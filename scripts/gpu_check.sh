#!/usr/bin/env bash
# The GPU checks, on a machine with a GPU, a pip PyTorch and no package registry
# (the lent device machine): builds against that machine's torch with the Debian
# -dev packages carried as .debs, then runs the GPU tests and the GPU benchmark.
#   bash scripts/gpu_check.sh build|test|bench|suite   (DEBS=dir of .deb files, DATA=Fashion-MNIST dir)
#   bash scripts/gpu_check.sh gpt   (issue 42's GPT-2-small benchmark against nanoGPT: bench/gpt/run_gpu.sh)
#   bash scripts/gpu_check.sh all   (one budgeted call: build the GPU targets, test, then the GPT
#                                    benchmark in what is left of BUDGET_S; `bench` is the CNN/MLP one)
#   bash scripts/gpu_check.sh profile   (where the eager step's time goes: ours and Python's traces of
#                                        CNN b64, reducer on, side by side; ~1 min; MODEL, BATCH)
# Prepare the carried files here with: NANOGPT_DIR=<a karpathy/nanoGPT checkout> bash scripts/gpu_check.sh pack
# (into the ignored .gpu/: name it in the device run's carry, e.g. carry [".gpu"]).
set -euo pipefail
cd "$(dirname "$0")/.."
DEBS=${DEBS:-.gpu/debs}
DATA=${DATA:-$PWD/.gpu/fashion-mnist}
DEPS=/tmp/ddp-deps
BUILD=build-gpu
OUT=${OUT:-/tmp/ddp-gpu-out}
PY=$(command -v python3)
mkdir -p "$OUT"

case "${1:-}" in
  pack)
    mkdir -p "$DEBS" "$DATA"
    (cd "$DEBS" && apt-get download libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 \
      libcxxopts-dev nlohmann-json3-dev libboost1.74-dev libboost-dev libboost-filesystem-dev \
      libboost-filesystem1.74-dev libboost-filesystem1.74.0 libboost-system1.74-dev libboost-system1.74.0 \
      libboost-atomic1.74.0 libgtest-dev zlib1g-dev libgloo-dev)
    cp /usr/share/datasets/fashion-mnist/*.gz "$DATA/"
    # The GPT benchmark's parts: nanoGPT's three files (the user's checkout, never committed here)
    # and Debian's fortunes as nanoGPT-format char tokens without meta.pkl (nanoGPT then takes GPT-2's
    # vocab 50304, as ours is told: model.vocab_size=50304).
    if [[ -n ${NANOGPT_DIR:-} ]]; then
      mkdir -p .gpu/nanogpt && cp "$NANOGPT_DIR"/{train.py,model.py,configurator.py} .gpu/nanogpt/
    else
      echo "gpu_check.sh pack: NANOGPT_DIR unset: no .gpu/nanogpt, so no GPT benchmark there" >&2
    fi
    mapfile -t texts < <(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort)
    [[ ${#texts[@]} -gt 0 ]] || { echo "gpu_check.sh pack: no fortunes; bash scripts/setup.sh --corpus" >&2; exit 2; }
    rm -rf .gpu/gpt_data
    .venv/bin/python scripts/prepare_text.py "${texts[@]}" --out .gpu/gpt_data --level char --format nanogpt >/dev/null
    rm -f .gpu/gpt_data/meta.pkl
    du -sh .gpu ;;
  build)
    nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    "$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' | tee -a "$OUT/gpu.txt"
    g++ --version | head -1 | tee -a "$OUT/gpu.txt"
    mkdir -p "$DEPS"
    for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DEPS"; done
    torch_prefix=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDP_USE_CCACHE=OFF -DDDP_PYTHON="$PY" \
      -DCMAKE_PREFIX_PATH="$torch_prefix;$DEPS/usr" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu 2>&1 | tail -5
    # TARGETS: what the GPU checks need (the whole suite builds when TARGETS=all).
    targets=()
    [ "${TARGETS:-all}" = all ] || for t in $TARGETS; do targets+=(--target "$t"); done
    cmake --build "$BUILD" -j"$(nproc)" "${targets[@]}" -- -k 0 > "$OUT/build_full.log" 2>&1 || { grep -E -A5 "error|FAILED" "$OUT/build_full.log" | head -80; exit 1; } ;;
  test)
    export DDP_FASHION_MNIST_ROOT=$DATA
    (cd "$BUILD" && ctest -R e2e_gpu --timeout "${TEST_TIMEOUT_S:-900}" --output-on-failure -V) 2>&1 | tee "$OUT/gpu_test.log" | tail -40 ;;
  suite)
    # The CPU suite with the GPU hidden: its multi-rank jobs use device auto, which on a one-GPU
    # host would (rightly) refuse a second rank; e2e_gpu is what runs on the GPU.
    export DDP_FASHION_MNIST_ROOT=$DATA
    (cd "$BUILD" && CUDA_VISIBLE_DEVICES= ctest -j8 -E e2e_gpu --output-on-failure --timeout 300) 2>&1 |
      tee "$OUT/suite.log" | tail -30 ;;
  bench)
    # Budgeted (DEADLINE_S, default 240): the most important comparisons run first.
    BUILD=$BUILD PY="$PY" bash bench/gpu/run_gpu_bench.sh 2> "$OUT/gpu_bench.err" | tee "$OUT/gpu_bench.jsonl"
    "$PY" bench/gpu/make_table.py "$OUT/gpu_bench.jsonl" --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" |
      tee "$OUT/gpu_bench.md" ;;
  gpt)
    # Budgeted (DEADLINE_S, default 360: no run starts after it).
    BUILD=$BUILD PY="$PY" NANOGPT=${NANOGPT:-.gpu/nanogpt} DATA=${GPT_DATA:-.gpu/gpt_data} bash bench/gpt/run_gpu.sh \
      2> "$OUT/gpt_bench.err" | tee "$OUT/gpt_bench.jsonl"
    "$PY" bench/gpt/gpu_table.py "$OUT/gpt_bench.jsonl" | tee "$OUT/gpt_bench.md" ;;
  profile)
    # Both sides' Chrome traces of PROFILE_STEPS steps after 200 warm-up steps, then where the time
    # goes per step (bench/gpu/trace_summary.py): host ops, CUDA runtime calls, GPU busy time.
    model=${MODEL:-cnn} batch=${BATCH:-64} steps=${PROFILE_STEPS:-20}
    "$BUILD/ddp-launch" --nproc_per_node=1 "$BUILD/worker" configs/synthetic_mlp.yaml device=cuda backend=nccl \
      model.name="$model" train.batch_size="$batch" train.max_steps=$((200 + steps)) train.log_every=100 \
      train.epochs=1000 eval.enabled=false data.synthetic_train=8192 comm.ddp_on_one_rank=true \
      output.profile_start=201 output.profile_steps="$steps" output.dir="$OUT/profile_ours" > "$OUT/profile_ours.log" 2>&1 ||
      tail -5 "$OUT/profile_ours.log"
    "$BUILD/ddp-launch" --nproc_per_node=1 "$PY" bench/gpu/python_gpu_reference.py --model "$model" --batch "$batch" \
      --warmup 200 --timed 50 --profile "$OUT/profile_python.json" --profile-steps "$steps" > "$OUT/profile_python.log" 2>&1 ||
      tail -5 "$OUT/profile_python.log"
    "$PY" bench/gpu/trace_summary.py ours="$OUT/profile_ours/profile_rank0.json" python="$OUT/profile_python.json" |
      tee "$OUT/profile.md" ;;
  all)
    # One lent-device call: build what the checks need, the GPU tests, then the GPT benchmark in
    # the seconds left of BUDGET_S (default 540); BENCH=cnn runs the CNN/MLP benchmark instead.
    start=$SECONDS
    TARGETS=${TARGETS:-"ddp-launch worker ddp_cuda gpu_test"} bash "$0" build
    echo "built in $((SECONDS - start)) s" | tee -a "$OUT/gpu.txt"
    TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-300} bash "$0" test || true
    echo "tests done at $((SECONDS - start)) s" | tee -a "$OUT/gpu.txt"
    if [[ ${BENCH:-gpt} == cnn ]]; then
      DEADLINE_S=$(( ${BUDGET_S:-540} - (SECONDS - start) - 40 )) HARD_S=$(( ${BUDGET_S:-540} - (SECONDS - start) - 10 )) \
        bash "$0" bench
    else
      # A torch.compile run takes ~1-3 min: none starts within 200 s of the budget's end.
      DEADLINE_S=$(( ${BUDGET_S:-540} - (SECONDS - start) - 200 )) RUN_TIMEOUT_S=190 bash "$0" gpt
    fi ;;
  *) echo "usage: gpu_check.sh pack|build|test|suite|bench|gpt|profile|all" >&2; exit 2 ;;
esac
