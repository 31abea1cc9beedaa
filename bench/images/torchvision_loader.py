#!/usr/bin/env python3
"""The reference side of bench/images: what a PyTorch user runs to stream an image folder —
torchvision.datasets.ImageFolder + DataLoader(num_workers=N) with the ImageNet training transform
(RandomResizedCrop(size) + RandomHorizontalFlip + ToTensor + Normalize), Pillow decoding. Prints one
JSON line: images/s over the timed batches, the time to the first batch, and the peak RSS of the main
process plus that of its largest worker (getrusage: RUSAGE_SELF + RUSAGE_CHILDREN).

--decoder tensor is torchvision's faster path, as its transforms docs' performance advice has it (v2,
tensors, uint8 for resizing):
torchvision.io.decode_image (libjpeg-turbo into a uint8 tensor, RGB) and transforms.v2 on the uint8
tensor (RandomResizedCrop with antialias + RandomHorizontalFlip, then ToDtype(float32, scale=True) +
Normalize on the 224 x 224 crop): the same recipe, without PIL images.

  torchvision_loader.py ROOT --workers N [--decoder pil|tensor] [--batch 64] [--size 224] [--batches 100] [--warmup 5]
"""
import argparse
import json
import resource
import sys
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2


def pil_train_transform(size):
    """torchvision's ImageNet training transform on PIL images (also torchvision_train.py's)."""
    return transforms.Compose([
        transforms.RandomResizedCrop(size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])


def tensor_loader(path):
    return decode_image(path, mode=ImageReadMode.RGB)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root", help="an ImageFolder root (ROOT/<class>/<image>)")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--decoder", choices=["pil", "tensor"], default="pil")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    if a.decoder == "pil":
        data = datasets.ImageFolder(a.root, transform=pil_train_transform(a.size))
    else:
        train = v2.Compose([
            v2.RandomResizedCrop(a.size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ])
        data = datasets.ImageFolder(a.root, transform=train, loader=tensor_loader)
    loader = DataLoader(data, batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=True,
                        persistent_workers=a.workers > 0, generator=torch.Generator().manual_seed(0))
    need = a.warmup + a.batches
    if need > len(loader):
        sys.exit(f"torchvision_loader.py: {need} batches asked, the folder has {len(loader)}")
    first = None
    images = 0
    for i, (x, y) in enumerate(loader):
        if i == 0:
            first = time.perf_counter() - start
        if i == a.warmup:
            t0 = time.perf_counter()
        if i >= a.warmup:
            images += x.shape[0]
        if i + 1 == need:
            break
    seconds = time.perf_counter() - t0
    rss_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss +
              resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    print(json.dumps({"side": "torchvision", "decoder": a.decoder, "workers": a.workers, "images_per_s": images / seconds,
                      "first_batch_s": first, "peak_rss_mb": rss_mb, "images": images}))


if __name__ == "__main__":
    main()
