#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh --tests, through build.sh), builds
# everything (the product, every test and benchmark: DDP_BUILD_TESTS=ON), runs every test with CTest,
# for each LibTorch build: DDP_TORCH=pip (2.x, the default build), debian (1.13), or all (both; default).
set -euo pipefail
cd "$(dirname "$0")/.."
# Root here can run the real Slurm and Open MPI tests (tests/e2e/cluster_test.cc): there a skip of
# them would hide a defect, so it fails instead. Set DDP_REQUIRE_CLUSTER_TESTS=0 to allow the skip.
if [[ $(id -u) -eq 0 ]]; then export DDP_REQUIRE_CLUSTER_TESTS=${DDP_REQUIRE_CLUSTER_TESTS:-1}; fi
flavours=${DDP_TORCH:-all}
[[ $flavours == all ]] && flavours="pip debian"
# The tests labelled "once" (tests/CMakeLists.txt, DDP_TESTS_ONCE: what does not depend on the
# LibTorch build) run in the first build's pass only; DDP_TEST_ALL=1 runs them in every pass.
once=()
for flavour in $flavours; do
  echo "=== LibTorch build: $flavour (at ${SECONDS} s) ==="
  DDP_TORCH=$flavour DDP_BUILD_TESTS=ON bash scripts/build.sh "$@"
  echo "=== $flavour built (at ${SECONDS} s); its tests: ==="
  build_dir=${DDP_BUILD_DIR:-$([[ $flavour == pip ]] && echo build || echo build-debian)}
  # In parallel, one test per core (DDP_TEST_JOBS overrides): most tests wait on processes and
  # sockets more than they compute, and CI must fit its time (tests/CMakeLists.txt: COST puts the
  # long ones first).
  (cd "$build_dir" && ctest --output-on-failure --timeout 900 -j"${DDP_TEST_JOBS:-$(nproc)}" "${once[@]}")
  echo "=== $flavour tested (at ${SECONDS} s) ==="
  [[ ${DDP_TEST_ALL:-0} == 1 ]] || once=(-LE once)
done
