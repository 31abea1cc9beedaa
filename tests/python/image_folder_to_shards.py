#!/usr/bin/env python3
"""Writes an ImageFolder split as WebDataset-style tar shards, in the order torchvision's own
ImageFolder lists the samples (classes sorted, then files sorted as its make_dataset walks them), so
sample i of the shards is sample i of the folder: <key>.<ext> with <key>.cls holding the class index.

    image_folder_to_shards.py SPLIT_DIR OUT_PREFIX PER_SHARD     -> OUT_PREFIX-00000.tar, ...
"""
import io
import os
import sys
import tarfile

from torchvision import datasets


def main():
    split, prefix, per_shard = sys.argv[1], sys.argv[2], int(sys.argv[3])
    samples = datasets.ImageFolder(split).samples
    tar = None
    for i, (path, label) in enumerate(samples):
        if i % per_shard == 0:
            if tar is not None:
                tar.close()
            tar = tarfile.open(f"{prefix}-{i // per_shard:05d}.tar", "w", format=tarfile.USTAR_FORMAT)
        ext = os.path.splitext(path)[1].lower()
        for name, payload in ((f"{i:06d}{ext}", open(path, "rb").read()), (f"{i:06d}.cls", str(label).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    if tar is not None:
        tar.close()
    print(len(samples))


if __name__ == "__main__":
    main()
