#!/usr/bin/env bash
# Installs what ddp-launch builds and tests with. Idempotent: prints nothing and touches nothing
# when everything is already installed.
# Usage: scripts/setup.sh [--debian] [--docs] [--corpus] [--tests]
#   (none)    what the default build (scripts/build.sh) and README's command 1 need: compilers,
#             the libraries, Fashion-MNIST, and .venv/ with the pinned torch.
#   --debian  also Debian's LibTorch 1.13, for the second build (DDP_TORCH=debian scripts/build.sh).
#   --docs    also Doxygen, for the API reference (scripts/docs.sh).
#   --corpus  also Debian's fortunes: ~2.5 MB of English text in /usr/share/games/fortunes for
#             scripts/prepare_text.py (the language-model walkthrough, docs/language_models.md).
#   --tests   everything the test suite needs (scripts/test.sh asks for it): all of the above, and
#             GoogleTest, a real Slurm, Open MPI and pdsh (and the corpus: CTest prepare_text reads it).
#  1. Debian packages.
#  2. .venv/ in the project tree (ignored by git): the pinned PyPI torch of scripts/requirements.txt,
#     whose LibTorch 2.x (CUDA + NCCL) is the default build and whose Python is the reference.
set -euo pipefail
cd "$(dirname "$0")/.."

debian=0 docs=0 corpus=0 tests=0
for arg in "$@"; do
  case "$arg" in
    --debian) debian=1 ;;
    --docs) docs=1 ;;
    --corpus) corpus=1 ;;
    --tests) tests=1 debian=1 docs=1 corpus=1 ;;  # both LibTorch builds are tested, the CTest docs runs Doxygen
    *) echo "setup.sh: unknown argument '$arg'; use --debian, --docs, --corpus or --tests" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ccache pkg-config
  python3 python3-venv              # makes .venv when no other python3 is on PATH
  libgloo-dev                       # Gloo headers: c10d's ProcessGroupGloo.hpp includes them, the torch wheel lacks them
  libcxxopts-dev libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev
  libboost-dev libboost-filesystem-dev   # Boost.Process v1 (header-only) needs boost_filesystem
  libprotobuf-dev protobuf-compiler # TensorBoard event files (worker/tensorboard)
  libpng-dev libjpeg62-turbo-dev    # data.name image_folder: PNG, and JPEG through libjpeg-turbo (as Pillow)
  libturbojpeg0-dev                 # streamed images (ddp/image_data.h): TurboJPEG API, DCT-scaled decode
  dataset-fashion-mnist             # /usr/share/datasets/fashion-mnist
  elfutils                          # eu-stack: the launcher's hang report reads a lagging rank's native stack
)
if (( debian )); then
  packages+=(
    libtorch-dev                    # LibTorch 1.13 (CPU, c10d + Gloo): the second, Debian build
    libopenblas0-openmp             # Debian LibTorch's GEMMs go through the system BLAS; Debian's default is the
                                    # reference BLAS, ~15x slower. OpenMP build: follows OMP_NUM_THREADS
  )
fi
if (( docs )); then
  packages+=(doxygen)               # the API reference from include/ddp (scripts/docs.sh, the CTest docs)
fi
if (( corpus )); then
  packages+=(fortunes)              # English text (BSD licence, Debian main) for scripts/prepare_text.py
fi
if (( tests )); then
  packages+=(
    libgtest-dev
    slurm-wlm munge                 # a real Slurm for tests/e2e/cluster_test.cc (scripts/slurm_cluster.sh)
    openmpi-bin pdsh                # a real mpirun and pdsh for the same tests
  )
fi

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
