#!/usr/bin/env python3
"""The reference for tests/libddp/image_data_test.cc: images written with Pillow, decoded by Pillow,
transformed by torchvision's own transforms on PIL images (torchvision==0.29.2, pure Python here).

    image_reference.py make DIR
writes the test images (no torch needed):
  DIR/folder/{ant,bee,cat}/...   ImageFolder layout: RGB/gray/CMYK/progressive JPEGs (q90), RGB, gray,
                                 1-bit, palette (+transparency), RGBA, LA, 16-bit, interlaced PNGs,
                                 one nested folder (torchvision's os.walk order)
  DIR/shards/shard-{0,1}.tar     the same samples in folder order, WebDataset style (<key>.jpg|png +
                                 <key>.cls, one extra .json member the loader must ignore)
  DIR/longnames/{ustar,gnu,pax}.tar  member paths over 100 bytes in each tar format
  DIR/bad/...                    a truncated JPEG, a corrupt PNG, an empty class folder, a text file
                                 named .jpg, tar shards with an unlabelled image, a bad label, no tar,
                                 a PNG and a JPEG whose headers claim 20000 x 20000 (bomb/)

    image_reference.py answer < request.json
reads {"dir", "decode": [{"file", "out", "denom"}],
       "crops": [{"height", "width", "draws": [u, ...]}],
       "train": [{"file", "out", "size", "draws"}],
       "eval": [{"file", "out", "size", "resize", "mean", "std", "float_out"}],
       "dct": [{"file", "out", "kind": "train" | "eval", "size", "resize", "draws"}]}
and prints {"decode": [[h, w]], "crops": [[i, j, h, w, draws used]], "train": [[i, j, h, w, flip]],
            "dct": [the scale denominator used]}.
The draws are our generator's uniforms in [0, 1); they are replayed through torchvision's code with
torch.Tensor.uniform_, torch.randint and torch.rand patched to use them in the order the code asks:
  uniform_(a, b) -> float32(u * float32(b - a) + a)  (the CPU kernel's formula, x = u)
  randint(lo, hi) -> lo + min(hi - lo - 1, floor(u * (hi - lo)))
  rand(1)         -> float32(u)
decode writes Pillow's convert("RGB") bytes (with Image.draft at scale 1/denom when denom > 1);
train writes Compose([RandomResizedCrop(size), RandomHorizontalFlip()]) of the RGB image;
eval writes Compose([Resize(resize), CenterCrop(size)]) bytes, and ToTensor + Normalize float32;
dct writes the DCT-scaled path as Pillow's draft + resize(box=...) computes it (dct_scaled).
"""
import io
import json
import math
import os
import sys
import tarfile
import zlib

import numpy as np
from PIL import Image

CLASSES = ["ant", "bee", "cat"]
BASE = {"ant": (200, 60, 40), "bee": (60, 190, 40), "cat": (40, 60, 210)}


def picture(cls, k, height, width):
    """A smooth picture with edges and noise: resampling has something to do."""
    rng = np.random.default_rng(zlib.crc32(f"{cls}/{k}".encode()))
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = np.array(BASE[cls], dtype=np.float64)
    wave = 60 * np.sin(x / (3 + k) + y / 7.0)[..., None] + 40 * ((x // 9 + y // 11) % 2)[..., None]
    pixels = base + wave + rng.normal(0, 18, size=(height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


# (file name, size (w, h), how): every decoder path Pillow has an answer for.
SAMPLES = {
    "ant": [("a0.jpg", (160, 120), "jpeg"), ("a1.jpeg", (97, 131), "jpeg_gray"), ("a2.png", (90, 70), "png"),
            ("a3.png", (64, 80), "png_palette_trns"), ("a4.JPG", (200, 150), "jpeg_progressive"),
            ("sub/a5.png", (70, 50), "png_rgba")],
    "bee": [("b0.jpg", (150, 110), "jpeg_420"), ("b1.png", (75, 60), "png_gray"), ("b2.png", (66, 99), "png_la"),
            ("b3.png", (80, 64), "png_16"), ("b4.png", (72, 72), "png_interlaced"), ("b5.jpg", (120, 90), "jpeg_cmyk")],
    "cat": [("c0.jpg", (128, 160), "jpeg_444"), ("c1.png", (60, 45), "png_1bit"), ("c2.jpg", (33, 300), "jpeg"),
            ("c3.png", (300, 20), "png"), ("c4.jpg", (180, 181), "jpeg"), ("c5.png", (40, 40), "png")],
}


def write_sample(path, cls, k, size, how):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img = picture(cls, k, size[1], size[0])
    if how == "jpeg":
        img.save(path, "JPEG", quality=90)
    elif how == "jpeg_gray":
        img.convert("L").save(path, "JPEG", quality=90)
    elif how == "jpeg_progressive":
        img.save(path, "JPEG", quality=90, progressive=True)
    elif how == "jpeg_420":
        img.save(path, "JPEG", quality=85, subsampling=2)
    elif how == "jpeg_444":
        img.save(path, "JPEG", quality=95, subsampling=0)
    elif how == "jpeg_cmyk":
        img.convert("CMYK").save(path, "JPEG", quality=90)
    elif how == "png":
        img.save(path)
    elif how == "png_gray":
        img.convert("L").save(path)
    elif how == "png_1bit":
        img.convert("1").save(path)
    elif how == "png_palette_trns":
        p = img.convert("P", palette=Image.ADAPTIVE, colors=40)
        p.save(path, transparency=3)
    elif how == "png_rgba":
        rgba = img.convert("RGBA")
        alpha = np.linspace(0, 255, size[0] * size[1]).reshape(size[1], size[0]).astype(np.uint8)
        rgba.putalpha(Image.fromarray(alpha))
        rgba.save(path)
    elif how == "png_la":
        la = img.convert("LA")
        la.putalpha(Image.fromarray(np.full((size[1], size[0]), 77, np.uint8)))
        la.save(path)
    elif how == "png_16":
        # 16-bit RGB written by hand through Pillow's raw PNG encoder is awkward; use numpy → PNG bytes.
        arr = (np.asarray(img).astype(np.uint16) * 256 + 3).astype(">u2")
        write_png16(path, arr)
    elif how == "png_interlaced":
        write_png_interlaced(path, np.asarray(img))
    else:
        raise ValueError(how)


def png_chunk(kind, data):
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def write_png16(path, arr):
    h, w, _ = arr.shape
    raw = b"".join(b"\x00" + arr[y].tobytes() for y in range(h))
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([16, 2, 0, 0, 0])
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw))
                + png_chunk(b"IEND", b""))


def write_png_raw(path, arr, depth, color_type):
    """A PNG of numpy samples (big-endian 16-bit, 8-bit, or 1/2/4-bit gray packed here), filter 0."""
    h, w = arr.shape[:2]
    if depth < 8:
        per = 8 // depth
        rows = []
        for y in range(h):
            bits = np.zeros((w + per - 1) // per * per, np.uint8)
            bits[:w] = arr[y]
            packed = np.zeros(len(bits) // per, np.uint8)
            for k in range(per):
                packed |= (bits[k::per] << (8 - depth * (k + 1))).astype(np.uint8)
            rows.append(packed.tobytes())
    else:
        rows = [arr[y].tobytes() for y in range(h)]
    raw = b"".join(b"\x00" + r for r in rows)
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([depth, color_type, 0, 0, 0])
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw))
                + png_chunk(b"IEND", b""))


def write_png_interlaced(path, arr):
    """Adam7, filter 0, 8-bit RGB: the passes written by hand (Pillow does not write interlaced)."""
    h, w, _ = arr.shape
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = arr[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        raw += b"".join(b"\x00" + sub[y].tobytes() for y in range(sub.shape[0]))
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, 2, 0, 0, 1])
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw))
                + png_chunk(b"IEND", b""))


def folder_order(root):
    """torchvision's ImageFolder order (make_dataset), written out here."""
    out = []
    for label, cls in enumerate(sorted(e.name for e in os.scandir(root) if e.is_dir())):
        for r, _, names in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
            for n in sorted(names):
                if n.lower().endswith((".jpg", ".jpeg", ".png")):
                    out.append((os.path.join(r, n), label))
    return out


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make(d):
    folder = os.path.join(d, "folder")
    for cls in CLASSES:
        for k, (name, size, how) in enumerate(SAMPLES[cls]):
            write_sample(os.path.join(folder, cls, name), cls, k, size, how)
    # The same samples as tar shards, in ImageFolder's order: 10 in the first, the rest in the second.
    os.makedirs(os.path.join(d, "shards"))
    order = folder_order(folder)
    for s, part in enumerate((order[:10], order[10:])):
        with tarfile.open(os.path.join(d, "shards", f"shard-{s}.tar"), "w") as tar:
            for n, (path, label) in enumerate(part):
                key = f"s{s}/{n:06d}"
                ext = os.path.splitext(path)[1].lower()
                with open(path, "rb") as f:
                    add_member(tar, key + ext, f.read())
                add_member(tar, key + ".cls", f"{label}\n".encode())
                if n == 1:
                    add_member(tar, key + ".json", b'{"note": "ignored"}')
    # Decode-only extras: 16-bit gray (Pillow's "I;16": clipped to 255), 2-bit gray, 16-bit gray+alpha.
    extra = os.path.join(d, "extra")
    os.makedirs(extra)
    rng = np.random.default_rng(11)
    write_png_raw(os.path.join(extra, "gray16.png"), rng.integers(0, 700, (9, 13)).astype(">u2"), 16, 0)
    write_png_raw(os.path.join(extra, "gray2.png"), rng.integers(0, 4, (7, 12)).astype(np.uint8), 2, 0)
    write_png_raw(os.path.join(extra, "la16.png"), rng.integers(0, 65536, (6, 5, 2)).astype(">u2"), 16, 4)
    # Member paths beyond ustar's 100-byte name: split into its prefix (USTAR), GNU's ././@LongLink
    # member, a pax header; two samples each, the first two of the folder order.
    os.makedirs(os.path.join(d, "longnames"))
    deep = "/".join(["a_rather_long_folder_name_%02d" % k for k in range(5)])
    for fmt, name in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")):
        with tarfile.open(os.path.join(d, "longnames", f"{name}.tar"), "w", format=fmt) as tar:
            for n, (path, label) in enumerate(order[:2]):
                key = f"{deep}/{name}_{n}"
                with open(path, "rb") as f:
                    add_member(tar, key + os.path.splitext(path)[1].lower(), f.read())
                add_member(tar, key + ".cls", f"{label}".encode())
    bad = os.path.join(d, "bad")
    # Decode errors met while loading: a JPEG cut in half, a PNG with a broken IDAT.
    write_sample(os.path.join(bad, "decode", "a", "good.jpg"), "ant", 0, (40, 30), "jpeg")
    write_sample(os.path.join(bad, "decode", "a", "trunc.jpg"), "ant", 1, (64, 48), "jpeg")
    with open(os.path.join(bad, "decode", "a", "trunc.jpg"), "rb") as f:
        data = f.read()
    with open(os.path.join(bad, "decode", "a", "trunc.jpg"), "wb") as f:
        f.write(data[: len(data) // 2])
    write_sample(os.path.join(bad, "decode", "b", "corrupt.png"), "bee", 0, (40, 30), "png")
    with open(os.path.join(bad, "decode", "b", "corrupt.png"), "r+b") as f:
        f.seek(60)
        f.write(b"\xde\xad\xbe\xef" * 8)
    write_sample(os.path.join(bad, "decode", "b", "good.png"), "bee", 1, (40, 30), "png")
    write_sample(os.path.join(bad, "decode", "b", "zgood.jpg"), "bee", 2, (40, 30), "jpeg")
    # A JPEG cut inside its Huffman tables (a fatal header error), then good ones: read by one thread,
    # only the cut one is bad (the thread's TurboJPEG handle, left failed, refused every later JPEG).
    write_sample(os.path.join(bad, "poison", "a", "0cut.jpg"), "ant", 0, (64, 48), "jpeg")
    with open(os.path.join(bad, "poison", "a", "0cut.jpg"), "rb") as f:
        data = f.read()
    with open(os.path.join(bad, "poison", "a", "0cut.jpg"), "wb") as f:
        f.write(data[: data.index(b"\xff\xc4") + 20])
    for k in range(1, 4):
        write_sample(os.path.join(bad, "poison", "a", f"{k}good.jpg"), "ant", k, (40, 30), "jpeg")
    write_sample(os.path.join(bad, "poison", "b", "good.jpg"), "bee", 0, (40, 30), "jpeg")
    # An empty class folder; a text file named .jpg.
    write_sample(os.path.join(bad, "empty", "a", "x.jpg"), "ant", 0, (20, 20), "jpeg")
    os.makedirs(os.path.join(bad, "empty", "b"))
    os.makedirs(os.path.join(bad, "text", "a"))
    with open(os.path.join(bad, "text", "a", "notes.jpg"), "w") as f:
        f.write("not a picture\n")
    # Headers that claim 20000 x 20000 pixels (4e8, over Pillow's decompression-bomb limit of
    # 2 * MAX_IMAGE_PIXELS) in a few hundred bytes: a PNG with a valid IHDR and one row of IDAT, a JPEG
    # whose SOF0 says so. Pillow refuses both at open; the loader must too, before allocating 1.2 GB.
    os.makedirs(os.path.join(bad, "bomb"))
    side = 20000
    ihdr = side.to_bytes(4, "big") + side.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    with open(os.path.join(bad, "bomb", "bomb.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
                + png_chunk(b"IDAT", zlib.compress(bytes(1 + 3 * side))) + png_chunk(b"IEND", b""))
    jpg = bytearray(open(os.path.join(bad, "decode", "a", "good.jpg"), "rb").read())
    sof = jpg.index(b"\xff\xc0")  # Pillow writes baseline JPEGs: length(2) precision(1) height(2) width(2)
    jpg[sof + 5:sof + 9] = side.to_bytes(2, "big") + side.to_bytes(2, "big")
    with open(os.path.join(bad, "bomb", "bomb.jpg"), "wb") as f:
        f.write(bytes(jpg))
    for name in ("bomb.png", "bomb.jpg"):
        try:
            Image.open(os.path.join(bad, "bomb", name))
        except Image.DecompressionBombError:
            continue
        raise AssertionError(f"Pillow opened bad/bomb/{name}: the file is not over its limit")
    # Tar shards: an image without its .cls, a .cls that is not a number, not a tar at all.
    jpg = open(os.path.join(bad, "decode", "a", "good.jpg"), "rb").read()
    with tarfile.open(os.path.join(bad, "nolabel.tar"), "w") as tar:
        add_member(tar, "k1.jpg", jpg)
        add_member(tar, "k1.cls", b"0")
        add_member(tar, "k2.jpg", jpg)
    with tarfile.open(os.path.join(bad, "badlabel.tar"), "w") as tar:
        add_member(tar, "k1.jpg", jpg)
        add_member(tar, "k1.cls", b"cat")
    with open(os.path.join(bad, "notatar.tar"), "wb") as f:
        f.write(np.random.default_rng(5).integers(0, 256, 3000, dtype=np.uint8).tobytes())


class Replay:
    """torch's random functions answered from a list of uniforms, in the order they are asked for."""

    def __init__(self, torch, draws):
        self.torch, self.draws, self.used = torch, list(draws), 0

    def next(self):
        u = self.draws[self.used]
        self.used += 1
        return u

    def __enter__(self):
        torch = self.torch
        self.saved = (torch.Tensor.uniform_, torch.randint, torch.rand)
        replay = self

        def uniform_(t, a=0.0, b=1.0):
            fa, fb = np.float32(a), np.float32(b)
            t.fill_(float(np.float32(replay.next() * float(fb - fa) + float(fa))))
            return t

        def randint(low, high=None, size=None, **kw):
            if high is None:
                low, high = 0, low
            n = high - low
            return torch.tensor([low + min(n - 1, math.floor(replay.next() * n))])

        def rand(*size, **kw):
            return torch.tensor([float(np.float32(replay.next()))], dtype=torch.float32)

        torch.Tensor.uniform_, torch.randint, torch.rand = uniform_, randint, rand
        return self

    def __exit__(self, *exc):
        self.torch.Tensor.uniform_, self.torch.randint, self.torch.rand = self.saved


def rgb_of(path):
    with Image.open(path) as img:  # ImageFolder's pil_loader
        return img.convert("RGB")


def dct_scaled(torch, T, q):
    """The loader's DCT-scaled path in Pillow's terms: the crop (torchvision's get_params on the
    replayed draws) or Resize's target decides the scale; a JPEG whose region is at least twice the
    target on both sides is opened with Image.draft at the smallest 1/2, 1/4, 1/8 still covering
    it, and resized with resize(box=the region in the smaller image's coordinates)."""
    from torchvision.transforms.functional import _compute_resized_output_size

    size = q["size"]
    img = Image.open(q["file"])
    W, H = img.size
    win = (0, 0)
    if q["kind"] == "train":
        with Replay(torch, q["draws"]) as r:
            i, j, h, w = T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])
        flip = np.float32(q["draws"][r.used]) < 0.5
        out_h, out_w = size, size
    else:
        i, j, h, w = 0, 0, H, W
        flip = False
        out_h, out_w = _compute_resized_output_size((H, W), [q["resize"]])
        win = (int(round((out_w - size) / 2.0)), int(round((out_h - size) / 2.0)))
    denom = 1
    if img.format == "JPEG" and h >= 2 * out_h and w >= 2 * out_w:
        need_h, need_w = -(-H * out_h // h), -(-W * out_w // w)
        for d in (8, 4, 2):
            if -(-H // d) >= need_h and -(-W // d) >= need_w:
                denom = d
                break
    if denom > 1:
        img.draft("RGB", (W // denom, H // denom))
        sw, sh = img.size
        fx, fy = sw / W, sh / H
        rgb = img.convert("RGB").resize((out_w, out_h), Image.BILINEAR,
                                        box=(j * fx, i * fy, (j + w) * fx, (i + h) * fy))
    else:
        rgb = img.convert("RGB").crop((j, i, j + w, i + h))
        if rgb.size != (out_w, out_h):
            rgb = rgb.resize((out_w, out_h), Image.BILINEAR)
    rgb = rgb.crop((win[0], win[1], win[0] + size, win[1] + size))
    if flip:
        rgb = rgb.transpose(Image.FLIP_LEFT_RIGHT)
    return rgb, denom


def answer(request):
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torchvision.transforms as T

    reply = {"decode": [], "crops": [], "train": []}
    for q in request.get("decode", []):
        with Image.open(q["file"]) as img:
            if q.get("denom", 1) > 1:
                w, h = img.size
                img.draft("RGB", (w // q["denom"], h // q["denom"]))
            rgb = np.asarray(img.convert("RGB"))
        rgb.tofile(q["out"])
        reply["decode"].append([int(rgb.shape[0]), int(rgb.shape[1])])
    for q in request.get("crops", []):
        with Replay(torch, q["draws"]) as r:
            box = T.RandomResizedCrop.get_params(torch.empty(1, q["height"], q["width"]), [0.08, 1.0], [3 / 4, 4 / 3])
        reply["crops"].append([int(v) for v in box] + [r.used])
    for q in request.get("train", []):
        img = rgb_of(q["file"])
        with Replay(torch, q["draws"]) as r:
            box = T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])
        with Replay(torch, q["draws"]) as r:
            out = T.Compose([T.RandomResizedCrop(q["size"]), T.RandomHorizontalFlip()])(img)
        # The flip is the draw after get_params's: flipped iff rand(1) < 0.5 on that draw.
        flip = np.float32(q["draws"][r.used - 1]) < 0.5
        np.asarray(out).tofile(q["out"])
        reply["train"].append([int(v) for v in box] + [int(flip)])
    reply["dct"] = []
    for q in request.get("dct", []):
        out, denom = dct_scaled(torch, T, q)
        np.asarray(out).tofile(q["out"])
        reply["dct"].append(denom)
    for q in request.get("eval", []):
        img = T.Compose([T.Resize(q["resize"]), T.CenterCrop(q["size"])])(rgb_of(q["file"]))
        np.asarray(img).tofile(q["out"])
        x = T.Normalize(q["mean"], q["std"])(T.ToTensor()(img))
        x.numpy().astype(np.float32).tofile(q["float_out"])
    return reply


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2])
        return
    print(json.dumps(answer(json.load(sys.stdin))))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
