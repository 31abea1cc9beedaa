#!/usr/bin/env bash
# Installs the Debian packages ddp-launch builds and tests with. Idempotent:
# prints nothing and touches nothing when everything is already installed.
set -euo pipefail

packages=(
  build-essential cmake ccache pkg-config
  libtorch-dev libgloo-dev          # LibTorch 1.13 (CPU, c10d + Gloo) and the Gloo headers c10d includes
  libopenblas0-openmp               # LibTorch's GEMMs go through the system BLAS; Debian's default is the
                                    # reference BLAS, ~15x slower. OpenMP build: follows OMP_NUM_THREADS
  libcxxopts-dev libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev
  libboost-dev libboost-filesystem-dev   # Boost.Process v1 (header-only) needs boost_filesystem
  libgtest-dev
  dataset-fashion-mnist             # /usr/share/datasets/fashion-mnist
  python3-torch python3-numpy       # the reference implementation for tests and benchmarks
  python3-pil                       # bench/dp draws its PNG chart with PIL
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
echo "setup: done"
