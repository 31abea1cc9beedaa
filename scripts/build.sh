#!/usr/bin/env bash
# Installs missing Debian packages, then configures and builds into build/.
# Usage: scripts/build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir=${DDP_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >"/tmp/ddp-cmake-$$.log" 2>&1 \
  || { cat "/tmp/ddp-cmake-$$.log"; exit 1; }
rm -f "/tmp/ddp-cmake-$$.log"
cmake --build "$build_dir" -j"$(nproc)"
