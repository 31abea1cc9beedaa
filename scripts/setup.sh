#!/usr/bin/env bash
# Installs what ddp-launch builds and tests with. Idempotent: prints nothing
# and touches nothing when everything is already installed.
#  1. Debian packages (compilers, libraries, Fashion-MNIST, LibTorch 1.13 for the second build).
#  2. .venv/ in the project tree (ignored by git): the pinned PyPI torch of scripts/requirements.txt,
#     whose LibTorch 2.x (CUDA + NCCL) is the default build and whose Python is the reference.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ccache pkg-config
  python3 python3-venv              # makes .venv when no other python3 is on PATH
  libtorch-dev                      # LibTorch 1.13 (CPU, c10d + Gloo): the second, Debian build
  libgloo-dev                       # Gloo headers: c10d's ProcessGroupGloo.hpp includes them, the torch wheel lacks them
  libopenblas0-openmp               # Debian LibTorch's GEMMs go through the system BLAS; Debian's default is the
                                    # reference BLAS, ~15x slower. OpenMP build: follows OMP_NUM_THREADS
  libcxxopts-dev libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev
  libboost-dev libboost-filesystem-dev   # Boost.Process v1 (header-only) needs boost_filesystem
  libgtest-dev
  libprotobuf-dev protobuf-compiler # TensorBoard event files (worker/tensorboard)
  libpng-dev libjpeg62-turbo-dev    # data.name image_folder: PNG, and JPEG through libjpeg-turbo (as Pillow)
  dataset-fashion-mnist             # /usr/share/datasets/fashion-mnist
  slurm-wlm munge                   # a real Slurm for tests/e2e/cluster_test.cc (scripts/slurm_cluster.sh)
  openmpi-bin pdsh                  # a real mpirun and pdsh for the same tests
  elfutils                          # eu-stack: the launcher's hang report reads a lagging rank's native stack
  doxygen                           # the API reference from include/ddp (scripts/docs.sh, the CTest docs)
)

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != *"install ok installed"* ]]; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The virtual environment: re-installed only when requirements.txt changed since the last install.
venv=.venv
stamp=$venv/.requirements.installed
if ! cmp -s scripts/requirements.txt "$stamp" 2>/dev/null; then
  echo "setup: installing scripts/requirements.txt into $venv (torch with CUDA: a few GB, once)"
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
  cp scripts/requirements.txt "$stamp"
fi
