#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
build_dir=${DDP_BUILD_DIR:-build}
cd "$build_dir"
ctest --output-on-failure --timeout 900
