#!/usr/bin/env bash
# The library as a user installs it: cmake --install, an out-of-tree program built with
# find_package(ddp_launch CONFIG), run under the installed ddp-launch with 2 ranks and no arguments.
# Usage: installed_example_test.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 source=$2 python=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "cmake --install"; }
for f in bin/ddp-launch bin/worker include/ddp/ddp.h include/ddp/version.h lib/cmake/ddp_launch/ddp_launchConfig.cmake; do
  [[ -e "$work/prefix/$f" ]] || fail "the install lacks $f"
done
ls "$work/prefix"/lib*/libddp.so >/dev/null || fail "the install lacks libddp.so"

# The installed programs load the LibTorch they were built with, even where another one sits in the
# system library directory (this machine has Debian's libtorch next to the wheel), and carry no
# RPATH entry that does not exist (LibTorch's MKL target names /lib/intel64*: pytorch#73008).
# The directory of the libtorch.so this build linked (the wheel's torch/lib, or Debian's multiarch dir).
torch_lib=$(dirname "$(realpath "$(sed -n 's/^TORCH_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")")")
for f in "$work/prefix/bin/worker" "$work/prefix/bin/ddp-launch" "$work/prefix"/lib*/libddp.so; do
  rpath=$(readelf -d "$f" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
  IFS=: read -ra entries <<<"$rpath"
  for e in "${entries[@]}"; do
    e=${e//\$ORIGIN/$(dirname "$f")}
    [[ -z "$e" || -d "$e" ]] || fail "$f has the RPATH entry '$e', which does not exist (RPATH: $rpath)"
  done
done
for f in "$work/prefix/bin/worker" "$work/prefix"/lib*/libddp.so; do
  libs=$(ldd "$f")
  # libtorch_cpu.so (the wheel) or libtorch_cpu.so.1.13 (Debian)
  loaded=$(sed -n 's/.*libtorch_cpu\.so[.0-9]* => \([^ ]*\) .*/\1/p' <<<"$libs")
  [[ -n "$loaded" && "$(realpath "$loaded")" == "$torch_lib"/* ]] || { echo "$libs"; fail "$f loads libtorch_cpu from '$loaded', not from $torch_lib"; }
done
"$work/prefix/bin/worker" --help >"$work/help.log" 2>&1 || { cat "$work/help.log"; fail "installed worker --help"; }
grep -q "config" "$work/help.log" || { cat "$work/help.log"; fail "installed worker --help printed no usage"; }
# The installed launcher and worker run a 2-rank job.
"$work/prefix/bin/ddp-launch" --nproc_per_node=2 "$work/prefix/bin/worker" "$source/configs/synthetic_mlp.yaml" \
  output.dir="$work/worker_out" train.max_steps=5 >"$work/worker.log" 2>&1 || { cat "$work/worker.log"; fail "installed worker, 2 ranks"; }
[[ -s "$work/worker_out/summary.json" ]] || { cat "$work/worker.log"; fail "the installed worker wrote no summary.json"; }
"$python" -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s.get('world_size') == 2 else 1)" \
  "$work/worker_out/summary.json" || { cat "$work/worker_out/summary.json"; fail "summary.json does not say world_size 2"; }

# Only the install prefix: LibTorch comes through the package (the one it was built with).
cmake -S "$source/examples/resnet_cifar" -B "$work/ex" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure the example"; }
cmake --build "$work/ex" -j2 >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build the example"; }
# It links the installed library, not the build tree's. (Output captured first: under pipefail,
# `ldd | grep -q` fails when grep exits at the first match and ldd then dies of SIGPIPE.)
libs=$(ldd "$work/ex/resnet_cifar")
[[ "$libs" == *"$work/prefix/"*libddp.so* ]] || { echo "$libs"; fail "not linked to the installed libddp.so"; }

# Another LibTorch than the one the package was built with is refused at configure time, with a line
# that names both (this machine has two: the wheel's and Debian's libtorch-dev).
built=$(realpath "$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")")
wheel=$(realpath "$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')/share/cmake/Torch")
debian=/usr/lib/x86_64-linux-gnu/cmake/Torch
other=$([[ "$built" == "$wheel" ]] && echo "$debian" || echo "$wheel")
if [[ -d "$other" ]]; then
  if cmake -S "$source/examples/resnet_cifar" -B "$work/ex-other" -DCMAKE_PREFIX_PATH="$work/prefix" \
       -DTorch_DIR="$other" >"$work/other.log" 2>&1; then
    fail "the example configured against $other, another LibTorch than the package's"
  fi
  # CMake wraps the message: compare with the lines joined.
  joined=$(tr '\n' ' ' <"$work/other.log" | tr -s ' ')
  grep -q "ddp_launch was built with LibTorch [0-9.]* (.*) but this project found LibTorch [0-9.]* (" <<<"$joined" \
    || { cat "$work/other.log"; fail "no line naming both LibTorch versions"; }
else
  echo "note: no second LibTorch at $other; the version check was not exercised"
fi

cd "$work"
# No arguments (defaults: 5 epochs into ./resnet_cifar_out).
"$work/prefix/bin/ddp-launch" --nproc_per_node=2 ./ex/resnet_cifar >"$work/run1.log" 2>&1 || { cat "$work/run1.log"; fail "first run"; }
cat "$work/run1.log"
grep -q "epoch 0: loss" "$work/run1.log" || fail "no epoch 0 line"
grep -q "world 2, backend " "$work/run1.log" || fail "not 2 ranks"
accuracy=$(sed -n 's/.*test accuracy \([0-9.]*\) (512 samples).*/\1/p' "$work/run1.log")
[[ -n "$accuracy" ]] || fail "no accuracy line over the 512 test samples"
# 10 classes: chance is 0.1; the patterns are easy to tell apart once trained.
"$python" -c "import sys; sys.exit(0 if float('$accuracy') > 0.6 else 1)" || fail "accuracy $accuracy <= 0.6"

# The export loads in Python into the same network, strictly (plain keys, CPU tensors).
"$python" - "$work/resnet_cifar_out/model.pt" <<'EOF' || fail "Python could not load the export"
import sys, torch
from torch import nn
class Block(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False); s.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        s.bn1 = nn.BatchNorm2d(c); s.bn2 = nn.BatchNorm2d(c)
class ResNet(nn.Module):
    def __init__(s, w=16, classes=10):
        super().__init__()
        s.stem = nn.Conv2d(3, w, 3, stride=2, padding=1); s.blocks = nn.Sequential(Block(w), Block(w)); s.head = nn.Linear(w, classes)
state = torch.load(sys.argv[1])  # weights_only=True, no map_location
ResNet().load_state_dict(state, strict=True)
assert all(t.device.type == "cpu" for t in state.values())
print("python: loaded", len(state), "tensors strictly")
EOF

# Run again with 6 epochs: it resumes after epoch 4 and trains only epoch 5.
"$work/prefix/bin/ddp-launch" --nproc_per_node=2 ./ex/resnet_cifar 6 >"$work/run2.log" 2>&1 || { cat "$work/run2.log"; fail "resumed run"; }
cat "$work/run2.log"
grep -q "resumed from .*ckpt-" "$work/run2.log" || fail "the second run did not resume"
grep -q "epoch 5: loss" "$work/run2.log" || fail "no epoch 5 line"
if grep -q "epoch [01234]: loss" "$work/run2.log"; then fail "the resumed run trained epochs it had already done"; fi
# LibTorch's own data pipeline (torch::data::datasets::MNIST, make_data_loader with 2 worker threads)
# fed by ddp::DataLoaderSampler, a model held in a plain std::shared_ptr: real Fashion-MNIST, 2 ranks.
fmnist=${DDP_FASHION_MNIST_ROOT:-/usr/share/datasets/fashion-mnist}
[[ -f "$fmnist/train-images-idx3-ubyte.gz" ]] || fail "no Fashion-MNIST in $fmnist (scripts/setup.sh installs dataset-fashion-mnist)"
mkdir -p "$work/fmnist"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  gunzip -c "$fmnist/$f.gz" >"$work/fmnist/$f"
done
cmake -S "$source/examples/fashion_mnist_loader" -B "$work/ex2" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure2.log" 2>&1 || { cat "$work/configure2.log"; fail "configure fashion_mnist_loader"; }
cmake --build "$work/ex2" -j2 >"$work/build2.log" 2>&1 || { cat "$work/build2.log"; fail "build fashion_mnist_loader"; }
"$work/prefix/bin/ddp-launch" --nproc_per_node=2 ./ex2/fashion_mnist_loader "$work/fmnist" 1 "$work/fmnist_mlp.pt" \
  >"$work/run3.log" 2>&1 || { cat "$work/run3.log"; fail "fashion_mnist_loader run"; }
cat "$work/run3.log"
# One epoch of 60 000 images over 2 ranks: 30 000 each, 469 batches of 64 (the last one 48).
grep -q "epoch 0: loss [0-9.]* over 469 steps per rank" "$work/run3.log" || fail "not 469 steps per rank"
accuracy=$(sed -n 's/.*world 2: test accuracy \([0-9.]*\) (10000 images).*/\1/p' "$work/run3.log")
[[ -n "$accuracy" ]] || fail "no test accuracy over the 10000 test images"
# An MLP after one epoch of SGD reaches ~0.84 on Fashion-MNIST; chance is 0.1.
"$python" -c "import sys; sys.exit(0 if float('$accuracy') > 0.78 else 1)" || fail "fashion_mnist_loader accuracy $accuracy <= 0.78"
"$python" -c "import sys, torch; s = torch.load(sys.argv[1]); assert sorted(s) == ['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight'], sorted(s)" \
  "$work/fmnist_mlp.pt" || fail "Python could not load the example's model"
echo "PASS"
