#!/usr/bin/python3
"""Expected values for tests/data/fashion_mnist_test.cc, computed independently
of our loader: gzip + numpy read the idx files, torch applies the documented
normalisation exactly as torchvision's ToTensor() + Normalize((0.2860,), (0.3530,)).

Usage: fashion_mnist_reference.py ROOT  -> JSON on stdout.
"""
import gzip
import json
import os
import sys

import numpy as np
import torch

MEAN, STD = 0.2860, 0.3530
SAMPLE_IMAGES = [0, 1, 12345]  # taken modulo the split size


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return magic, dims, np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(root, name):
    gz = os.path.join(root, name + ".gz")
    return gz if os.path.exists(gz) else os.path.join(root, name)


def split(root, prefix):
    img_magic, img_dims, images = read_idx(find(root, prefix + "-images-idx3-ubyte"))
    lbl_magic, lbl_dims, labels = read_idx(find(root, prefix + "-labels-idx1-ubyte"))
    n = img_dims[0]
    # torchvision: ToTensor = float().div(255); Normalize = sub_(mean).div_(std), float32.
    norm = torch.from_numpy(images.copy()).unsqueeze(1).float().div(255)
    norm.sub_(torch.tensor([MEAN]).view(-1, 1, 1)).div_(torch.tensor([STD]).view(-1, 1, 1))
    return {
        "image_magic": img_magic, "label_magic": lbl_magic,
        "count": n, "rows": img_dims[1], "cols": img_dims[2], "label_count": lbl_dims[0],
        "first_labels": labels[:20].astype(int).tolist(),
        "label_histogram": np.bincount(labels, minlength=10).astype(int).tolist(),
        "raw_pixel_sum": int(images.astype(np.int64).sum()),
        "raw_pixel_mean": float(images.astype(np.float64).mean()),
        "normalised_mean": float(norm.double().mean()),
        "normalised_std": float(norm.double().std()),
        # float32 values widened to double: exact, so C++ can compare with ==.
        "samples": {str(i % n): norm[i % n].flatten().double().tolist() for i in SAMPLE_IMAGES},
    }


def main():
    root = sys.argv[1]
    out = {"train": split(root, "train"), "test": split(root, "t10k")}
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
