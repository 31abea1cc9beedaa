#!/usr/bin/env python3
"""The reference for tests/libddp/token_data_test.cc: token shards written with numpy, and the
windows nanoGPT's get_batch and llm.c's DataLoader take from them, with torch on the pinned wheel.

Reads one JSON object on stdin:
  {"dir": path,
   "files": [{"name", "dtype": "uint16" | "uint32", "n", "high", "seed",   tokens: n draws in [0, high)
              "set": [[position, token], ...],                             then these tokens put in
              "magic", "version", "count",            an llm.c header (count: n unless given); no magic: raw
              "truncate_to": bytes, "append": bytes}],                     then the file cut or extended
   "random": [{"files": [names], "block", "batch", "seed", "rank", "step"}],
   "sequential": [{"file", "block", "batch", "rank", "world", "step"}]}
writes the files under dir and prints
  {"tokens": {name: [tokens], ...} (as written),
   "random": [{"draw_seed", "starts", "x", "y"}]   nanoGPT's get_batch over the files as one list of
             valid starts (ntok - block per file), torch.randint on a generator seeded with
             splitmix64(splitmix64(splitmix64(seed) ^ rank) ^ step); starts count every file's tokens,
   "sequential": [{"x", "y"}]}   llm.c's DataLoader in one shard: B*T + 1 tokens at
             (step * world + rank) * B * T, x = buf[:-1].view(B, T), y = buf[1:].view(B, T).
The shards are read back here with np.memmap, by llm.c's header rules, not by the library.
"""
import json
import os
import sys

import numpy as np
import torch

MASK = (1 << 64) - 1
HEADER_INTS = 256


def write_file(d, spec):
    rng = np.random.default_rng(spec.get("seed", 0))
    tokens = rng.integers(0, spec.get("high", 1), size=spec.get("n", 0), dtype=np.int64)
    for position, token in spec.get("set", []):
        tokens[position] = token
    tokens = tokens.astype(spec.get("dtype", "uint16"))
    path = os.path.join(d, spec["name"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        if "magic" in spec:
            header = np.zeros(HEADER_INTS, dtype=np.int32)
            header[0] = spec["magic"]
            header[1] = spec["version"]
            header[2] = spec.get("count", len(tokens))
            f.write(header.tobytes())
        f.write(tokens.tobytes())
        f.write(b"\x00" * spec.get("append", 0))
    if "truncate_to" in spec:
        os.truncate(path, spec["truncate_to"])
    return [int(t) for t in tokens]


def memmap_tokens(path):
    """The tokens of a shard, as llm.c and nanoGPT read them."""
    head = np.fromfile(path, dtype=np.int32, count=3) if os.path.getsize(path) >= 12 else np.zeros(3, np.int32)
    if head[0] == 20240520:
        return np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_INTS * 4, shape=(int(head[2]),))
    if head[0] == 20240801:
        return np.memmap(path, dtype=np.uint32, mode="r", offset=HEADER_INTS * 4, shape=(int(head[2]),))
    return np.memmap(path, dtype=np.uint16, mode="r")


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def draw_seed(seed, rank, step):
    return splitmix64(splitmix64(splitmix64(seed) ^ rank) ^ step)


def random_batch(d, r):
    data = [memmap_tokens(os.path.join(d, name)) for name in r["files"]]
    block, batch = r["block"], r["batch"]
    valid = [len(tokens) - block for tokens in data]  # nanoGPT: torch.randint(len(data) - block_size, ...)
    s = draw_seed(r["seed"], r["rank"], r["step"])
    g = torch.Generator().manual_seed(s)
    ix = torch.randint(sum(valid), (batch,), generator=g)
    starts, xs, ys = [], [], []
    for i in ix.tolist():
        f = 0
        while i >= valid[f]:
            i -= valid[f]
            f += 1
        starts.append(sum(len(tokens) for tokens in data[:f]) + i)
        xs.append(torch.from_numpy(data[f][i:i + block].astype(np.int64)))
        ys.append(torch.from_numpy(data[f][i + 1:i + 1 + block].astype(np.int64)))
    return {"draw_seed": str(s), "starts": starts, "x": torch.stack(xs).tolist(), "y": torch.stack(ys).tolist()}


def sequential_batch(d, q):
    tokens = memmap_tokens(os.path.join(d, q["file"]))
    b, t = q["batch"], q["block"]
    position = (q["step"] * q["world"] + q["rank"]) * b * t  # llm.c: current_sample_idx, process_rank
    buf = torch.from_numpy(tokens[position:position + b * t + 1].astype(np.int64))
    return {"x": buf[:-1].view(b, t).tolist(), "y": buf[1:].view(b, t).tolist()}


def main():
    request = json.load(sys.stdin)
    d = request["dir"]
    reply = {"tokens": {spec["name"]: write_file(d, spec) for spec in request.get("files", [])}}
    reply["random"] = [random_batch(d, r) for r in request.get("random", [])]
    reply["sequential"] = [sequential_batch(d, q) for q in request.get("sequential", [])]
    json.dump(reply, sys.stdout)


if __name__ == "__main__":
    main()
