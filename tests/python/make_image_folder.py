"""Writes a small ImageFolder tree with Pillow, and what Python decodes from it.

    python make_image_folder.py DIR

DIR/good/{train,test}/{ant,bee,cat}/*.png|*.jpg: RGB, grayscale, palette and RGBA PNGs and RGB and
grayscale JPEGs, 12x10, with a learnable colour per class. DIR/good_reference_{train,test}.pt:
{"x": uint8 [N, 3, 10, 12], "y": labels} as torchvision's ImageFolder + pil_loader (convert("RGB"))
orders and decodes them; DIR/good_resized_{train,test}.pt: the same x resized to 8x8 as
torchvision's Resize on tensors (bilinear, antialias=True), rounded back to uint8.
DIR/broken/...: a class folder whose .png is not an image. DIR/empty/...: a class folder with no
image. DIR/mismatch/...: test lacks a class. DIR/nested/train/{ant,bee}/: images at the top of a
class folder, in sub-folders that sort differently as folders and as whole paths ('a/' before
'a.b/', but 'a.b/z' before 'a/z'), and in a folder reached through a symbolic link;
DIR/nested_reference.pt: {"x", "y"} in the order torchvision's ImageFolder lists them (its own
make_dataset: sorted(os.walk(followlinks=True)), then sorted names).
"""
import os
import sys
import zlib

import numpy as np
import torch
from PIL import Image

CLASSES = ["ant", "bee", "cat"]
BASE = {"ant": (200, 40, 40), "bee": (40, 200, 40), "cat": (40, 40, 200)}


def image(cls, k, mode):
    rng = np.random.default_rng(zlib.crc32(f"{cls}/{k}".encode()))
    base = np.array(BASE[cls], dtype=np.int16)
    pixels = np.clip(base + rng.integers(-40, 40, size=(10, 12, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels)
    if mode == "L":
        return img.convert("L")
    if mode == "P":
        return img.convert("P", palette=Image.ADAPTIVE, colors=32)
    if mode == "RGBA":
        return img.convert("RGBA")
    return img


def write_tree(root, splits, per_class=6):
    for split, classes in splits.items():
        for cls in classes:
            d = os.path.join(root, split, cls)
            os.makedirs(d, exist_ok=True)
            for k in range(per_class):
                kind = k % 6
                if kind == 0:
                    image(cls, (split, k), "RGB").save(f"{d}/{k:03d}.png")
                elif kind == 1:
                    image(cls, (split, k), "L").save(f"{d}/{k:03d}.png")
                elif kind == 2:
                    image(cls, (split, k), "P").save(f"{d}/{k:03d}.png")
                elif kind == 3:
                    image(cls, (split, k), "RGBA").save(f"{d}/{k:03d}.PNG")
                elif kind == 4:
                    image(cls, (split, k), "RGB").save(f"{d}/{k:03d}.jpg", quality=90)
                else:
                    image(cls, (split, k), "L").save(f"{d}/{k:03d}.jpeg", quality=85)


def reference(root, split):
    """ImageFolder's order: classes sorted, files sorted by path within each class."""
    xs, ys = [], []
    for label, cls in enumerate(sorted(os.listdir(os.path.join(root, split)))):
        d = os.path.join(root, split, cls)
        for name in sorted(os.listdir(d)):
            with Image.open(os.path.join(d, name)) as img:
                xs.append(torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1).contiguous())
            ys.append(label)
    return torch.stack(xs), torch.tensor(ys)


def write_nested(out):
    train = os.path.join(out, "nested", "train")
    linked = os.path.join(out, "nested_linked")  # outside the split: reached only through the link
    for d in ("ant/a", "ant/a.b", "bee"):
        os.makedirs(os.path.join(train, d))
    os.makedirs(linked)
    image("ant", 0, "RGB").save(os.path.join(train, "ant", "top.png"))
    image("ant", 1, "L").save(os.path.join(train, "ant", "a", "z.png"))
    image("ant", 2, "RGB").save(os.path.join(train, "ant", "a.b", "z.jpg"), quality=90)
    image("ant", 3, "P").save(os.path.join(linked, "in_link.png"))
    os.symlink(linked, os.path.join(train, "ant", "link"))
    image("bee", 0, "RGB").save(os.path.join(train, "bee", "b.png"))
    from torchvision.datasets.folder import find_classes, make_dataset
    _, index = find_classes(train)
    xs, ys = [], []
    for path, label in make_dataset(train, index, extensions=(".png", ".jpg", ".jpeg")):
        with Image.open(path) as img:
            xs.append(torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1).contiguous())
        ys.append(label)
    assert len(xs) == 5, "the linked folder's image is one of torchvision's samples"
    torch.save({"x": torch.stack(xs), "y": torch.tensor(ys)}, os.path.join(out, "nested_reference.pt"))


def main():
    out = sys.argv[1]
    good = os.path.join(out, "good")
    write_tree(good, {"train": CLASSES, "test": CLASSES}, per_class=12)
    for split in ("train", "test"):
        x, y = reference(good, split)
        torch.save({"x": x, "y": y}, os.path.join(out, f"good_reference_{split}.pt"))
        resized = torch.nn.functional.interpolate(x.float(), size=(8, 8), mode="bilinear", antialias=True,
                                                  align_corners=False).round().clamp(0, 255).to(torch.uint8)
        torch.save({"x": resized, "y": y}, os.path.join(out, f"good_resized_{split}.pt"))
    write_tree(os.path.join(out, "broken"), {"train": CLASSES, "test": CLASSES}, per_class=2)
    with open(os.path.join(out, "broken", "train", "bee", "zz.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\nthis is not a PNG")
    write_tree(os.path.join(out, "empty"), {"train": CLASSES, "test": CLASSES}, per_class=2)
    os.makedirs(os.path.join(out, "empty", "train", "dog"))
    os.makedirs(os.path.join(out, "empty", "test", "dog"))
    write_tree(os.path.join(out, "mismatch"), {"train": CLASSES, "test": CLASSES[:2]}, per_class=2)
    write_nested(out)


if __name__ == "__main__":
    main()
