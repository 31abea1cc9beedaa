#!/usr/bin/env bash
# Installs what is missing, then configures and builds.
# Usage: [DDP_TORCH=pip|debian] [DDP_BUILD_TESTS=ON|OFF] scripts/build.sh [extra cmake -D options]
#   pip (default): LibTorch 2.x of the pinned PyPI torch in .venv (CUDA + NCCL), into build/
#   debian:        Debian's libtorch-dev 1.13 (CPU), into build-debian/
# DDP_BUILD_TESTS=OFF: the product only: ddp-launch, worker, libddp.so (and libddp_cuda.so with a
#   CUDA LibTorch), all that README's command 1 and `cmake --install` need; the benchmarks build on
#   request (cmake --build BUILD --target ddp_bench).
# DDP_BUILD_TESTS=ON (scripts/test.sh sets it): also what the tests need (scripts/setup.sh --tests),
#   and every test and benchmark.
# Unset: a build directory configured before keeps its choice (one that scripts/test.sh made goes on
#   building the tests); a new one gets the product only.
# DDP_BUILD_DIR overrides the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${DDP_TORCH:-pip}
case "$flavour" in
  pip) build_dir=${DDP_BUILD_DIR:-build} ;;
  debian) build_dir=${DDP_BUILD_DIR:-build-debian} ;;
  *) echo "build.sh: DDP_TORCH is '$flavour'; use pip or debian" >&2; exit 2 ;;
esac
tests=${DDP_BUILD_TESTS:-}
if [[ -z $tests ]]; then
  tests=$(sed -n 's/^DDP_BUILD_TESTS:BOOL=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
fi
# A -DDDP_BUILD_TESTS=... among the extra options wins in CMake (it comes last); it does here too,
# so that the tests' packages are installed when it turns them on.
for arg in "$@"; do
  if [[ $arg =~ ^-DDDP_BUILD_TESTS(:BOOL)?=(.*)$ ]]; then tests=${BASH_REMATCH[2]}; fi
done
case "${tests^^}" in
  ON|1|TRUE|YES|Y) tests=ON ;;
  OFF|0|FALSE|NO|N|"") tests=OFF ;;
  *) echo "build.sh: DDP_BUILD_TESTS is '$tests'; use ON or OFF" >&2; exit 2 ;;
esac
setup_args=()
if [[ $flavour == debian ]]; then setup_args+=(--debian); fi
if [[ $tests == ON ]]; then setup_args+=(--tests); fi
bash scripts/setup.sh "${setup_args[@]}"
python=$PWD/.venv/bin/python
torch_args=()
if [[ $flavour == pip ]]; then
  torch_prefix=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  torch_args=(-DCMAKE_PREFIX_PATH="$torch_prefix")
fi
log=$(mktemp)
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDDP_PYTHON="$python" -DDDP_BUILD_TESTS="$tests" \
  "${torch_args[@]}" "$@" >"$log" 2>&1 \
  || { cat "$log"; rm -f "$log"; exit 1; }
rm -f "$log"
cmake --build "$build_dir" -j"$(nproc)"
