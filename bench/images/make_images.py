#!/usr/bin/env python3
"""An ImageNet-like image set made from a real image source on this machine (issue 43 (4)): no
downloads. Each picture is a Fashion-MNIST item (Debian's dataset-fashion-mnist) upscaled into the
middle of a mosaic of other items, colourised with a per-picture palette and given a little sensor
noise, at ImageNet's typical sizes (320-480 x 280-420), saved as JPEG quality 90; its class is the
middle item's, and the classes take turns (picture n is of class n mod 10), so every split of 10
pictures or more holds every class. Both layouts the loader reads:

  OUT/folder/{train,val}/<class>/<n>.jpg               torchvision's ImageFolder layout
  OUT/tar/{train,val}-NNNNN.tar  (<key>.jpg, <key>.cls)  WebDataset-style shards

  make_images.py --out DIR [--train 50000] [--val 5000] [--layout both|folder|tar]
                 [--shard 1000] [--seed 0] [--jobs N] [--size WxH]

--size gives every picture one size (tests: a size the loader need not resample).

Deterministic from --seed (the same bytes every time, any --jobs).
"""
import argparse
import gzip
import io
import os
import sys
import tarfile
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

SOURCE = "/usr/share/datasets/fashion-mnist"
CLASSES = ["tshirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
           "ankle_boot"]


def read_idx(name):
    with gzip.open(os.path.join(SOURCE, name), "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


ITEMS = None
BY_CLASS = None


def load_source():
    global ITEMS, BY_CLASS
    if ITEMS is None:
        ITEMS = np.concatenate([read_idx("train-images-idx3-ubyte.gz"), read_idx("t10k-images-idx3-ubyte.gz")])
        labels = np.concatenate([read_idx("train-labels-idx1-ubyte.gz"), read_idx("t10k-labels-idx1-ubyte.gz")])
        BY_CLASS = [np.flatnonzero(labels == c) for c in range(len(CLASSES))]


def picture(index, seed, size=None):
    """The JPEG bytes and class of picture `index` (a pure function of index, seed and size)."""
    load_source()
    rng = np.random.default_rng([seed, index])
    width, height = int(rng.integers(320, 481)), int(rng.integers(280, 421))
    if size:
        width, height = size
    label = index % len(CLASSES)
    main = int(BY_CLASS[label][rng.integers(len(BY_CLASS[label]))])
    # A mosaic of other items, 4-6 per row, behind the main item.
    cols = int(rng.integers(4, 7))
    tile = width // cols + 1
    rows = height // tile + 1
    mosaic = Image.new("L", (cols * tile, rows * tile))
    for r in range(rows):
        for c in range(cols):
            other = Image.fromarray(ITEMS[int(rng.integers(len(ITEMS)))]).resize((tile, tile), Image.BILINEAR)
            mosaic.paste(other, (c * tile, r * tile))
    gray = np.asarray(mosaic.crop((0, 0, width, height)), np.float32) * 0.45
    side = int(min(width, height) * rng.uniform(0.6, 0.9))
    item = np.asarray(Image.fromarray(ITEMS[main]).resize((side, side), Image.BICUBIC), np.float32)
    x0, y0 = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
    region = gray[y0:y0 + side, x0:x0 + side]
    gray[y0:y0 + side, x0:x0 + side] = np.maximum(region, item)
    # A palette from two random colours, and noise so the JPEG has texture to code.
    low, high = rng.uniform(0, 120, 3), rng.uniform(135, 255, 3)
    t = (gray / 255.0)[..., None]
    rgb = low + t * (high - low) + rng.normal(0, 6, (height, width, 3))
    out = io.BytesIO()
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue(), label


def make_range(args):
    first, count, seed, size = args
    return [picture(i, seed, size) for i in range(first, first + count)]


def write_split(out, split, first, count, layout, shard, seed, jobs, size):
    chunk = 500
    starts = list(range(first, first + count, chunk))
    work = [(s, min(chunk, first + count - s), seed, size) for s in starts]
    tar = None
    written = 0
    with ProcessPoolExecutor(jobs) as pool:
        for s, pictures in zip(starts, pool.map(make_range, work)):
            for k, (data, label) in enumerate(pictures):
                n = s - first + k
                if layout in ("both", "folder"):
                    d = os.path.join(out, "folder", split, CLASSES[label])
                    os.makedirs(d, exist_ok=True)
                    with open(os.path.join(d, f"{n:07d}.jpg"), "wb") as f:
                        f.write(data)
                if layout in ("both", "tar"):
                    if n % shard == 0:
                        if tar is not None:
                            tar.close()
                        os.makedirs(os.path.join(out, "tar"), exist_ok=True)
                        tar = tarfile.open(os.path.join(out, "tar", f"{split}-{n // shard:05d}.tar"), "w",
                                           format=tarfile.USTAR_FORMAT)
                    for name, payload in ((f"{n:07d}.jpg", data), (f"{n:07d}.cls", str(label).encode())):
                        info = tarfile.TarInfo(name)
                        info.size = len(payload)
                        info.mtime = 0
                        tar.addfile(info, io.BytesIO(payload))
                written += 1
            print(f"\r{split}: {written}/{count}", end="", file=sys.stderr, flush=True)
    if tar is not None:
        tar.close()
    print(file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=50000)
    p.add_argument("--val", type=int, default=5000)
    p.add_argument("--layout", choices=["both", "folder", "tar"], default="both")
    p.add_argument("--shard", type=int, default=1000, help="pictures per tar shard")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--size", help="WxH for every picture (default: ImageNet-like sizes)")
    a = p.parse_args()
    size = None
    if a.size:
        try:
            size = tuple(int(v) for v in a.size.lower().split("x"))
            assert len(size) == 2 and min(size) >= 8
        except (ValueError, AssertionError):
            sys.exit(f"make_images.py: --size is '{a.size}'; use WxH, e.g. 32x32 (8 or more each)")
    if not os.path.isdir(SOURCE):
        sys.exit(f"make_images.py: no {SOURCE}; bash scripts/setup.sh installs dataset-fashion-mnist")
    if a.train < 1 or a.val < 0 or a.shard < 1:
        sys.exit("make_images.py: --train must be >= 1, --val >= 0, --shard >= 1")
    write_split(a.out, "train", 0, a.train, a.layout, a.shard, a.seed, a.jobs, size)
    if a.val:
        # Validation pictures use other indices (other mosaics, other palettes) than training's.
        write_split(a.out, "val", 10_000_000, a.val, a.layout, a.shard, a.seed, a.jobs, size)


if __name__ == "__main__":
    main()
