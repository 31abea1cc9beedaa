#!/usr/bin/env bash
# Installs what is missing, then configures and builds.
# Usage: [DDP_TORCH=pip|debian] scripts/build.sh [extra cmake -D options]
#   pip (default): LibTorch 2.x of the pinned PyPI torch in .venv (CUDA + NCCL), into build/
#   debian:        Debian's libtorch-dev 1.13 (CPU), into build-debian/
# DDP_BUILD_DIR overrides the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
flavour=${DDP_TORCH:-pip}
python=$PWD/.venv/bin/python
case "$flavour" in
  pip)
    build_dir=${DDP_BUILD_DIR:-build}
    torch_prefix=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
    torch_args=(-DCMAKE_PREFIX_PATH="$torch_prefix") ;;
  debian)
    build_dir=${DDP_BUILD_DIR:-build-debian}
    torch_args=() ;;
  *) echo "build.sh: DDP_TORCH is '$flavour'; use pip or debian" >&2; exit 2 ;;
esac
log=$(mktemp)
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDDP_PYTHON="$python" "${torch_args[@]}" "$@" >"$log" 2>&1 \
  || { cat "$log"; rm -f "$log"; exit 1; }
rm -f "$log"
cmake --build "$build_dir" -j"$(nproc)"
