#!/usr/bin/env python3
"""Turns text files into token shards (llm.c's or nanoGPT's) for a GPT (issue 42).

    .venv/bin/python scripts/prepare_text.py INPUT... --out DIR [--level byte|char|gpt2]
        [--val_fraction 0.1] [--shard_tokens 100000000] [--format llmc|nanogpt]

Levels:
  byte  vocab 256: the files' bytes are the tokens (any file, UTF-8 or not).
  char  nanoGPT's shakespeare_char/prepare.py: the vocabulary is the sorted set of the characters of
        all inputs (UTF-8), token = index in it. Unlike nanoGPT no newline translation: decoding the
        tokens gives the files' text exactly.
  gpt2  GPT-2's BPE through tiktoken, only when tiktoken and its GPT-2 encoding files are already on
        this machine (never downloads); each input is a document, and llm.c's EOT token (50256)
        precedes each one (llm.c's fineweb.py: tokens = [eot] + encode_ordinary(doc)).
The inputs are concatenated in the order given. The first int(n * (1 - val_fraction)) tokens of
the stream are train, the rest val (nanoGPT's 90/10 split at the default).

Formats (DIR/meta.json always: level, vocab_size, token counts, itos for char, encoding for gpt2):
  llmc     llm.c's shards: a 256 x int32 little-endian header (20240520, 1, token count, 0...) and
           the uint16 tokens; DIR/train_000000.bin, ... a new one every --shard_tokens tokens, and
           DIR/val_000000.bin, ... alike. A last piece shorter than half of --shard_tokens joins
           the shard before it: a tail of a few tokens would be a shard no window fits in (the
           worker refuses one shorter than model.block_size + 1, llm.c's loader one shorter than a
           step), so every shard but a split's only one holds at least --shard_tokens / 2 tokens.
  nanogpt  nanoGPT's DIR/train.bin and DIR/val.bin (raw uint16) and DIR/meta.pkl as
           shakespeare_char/prepare.py writes it ({vocab_size, itos, stoi}); byte level writes the
           256 bytes as Latin-1 characters there, gpt2 no meta.pkl (as nanoGPT's openwebtext).

Bad input (a missing, empty or, for char/gpt2, non-UTF-8 input; --val_fraction outside (0, 1); an
--out holding files; a vocabulary too large for uint16) is one line on stderr and exit 2, with
nothing written: the output goes to a temporary folder beside DIR, renamed to DIR at the end.
"""
import argparse
import hashlib
import json
import os
import pickle
import shutil
import stat
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:
    print("prepare_text: needs numpy; run it with the project's .venv/bin/python "
          "(bash scripts/setup.sh makes it) or pip install numpy", file=sys.stderr)
    sys.exit(2)

LLMC_MAGIC = 20240520  # llm.c's data_common.py, "gpt-2": uint16 tokens
LLMC_VERSION = 1
LLMC_HEADER_INTS = 256
UINT16_VOCAB = 1 << 16  # ids 0..65535 fit a uint16 token
LLMC_MAX_SHARD = 2**31 - 1  # header[2] is an int32


class BadInput(Exception):
    """One line for stderr: what is wrong and how to fix it."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise BadInput(f"{message} (see --help)")


def parse_args(argv):
    p = OneLineParser(prog="prepare_text.py", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text files, concatenated in this order")
    p.add_argument("--out", required=True, metavar="DIR", help="new (or empty) output folder")
    p.add_argument("--level", choices=["byte", "char", "gpt2"], default="byte")
    p.add_argument("--val_fraction", type=float, default=0.1, metavar="F",
                   help="the share of the stream's tail kept for validation (default 0.1)")
    p.add_argument("--shard_tokens", type=int, default=100_000_000, metavar="N",
                   help="tokens per llm.c shard (default 100000000, llm.c's)")
    p.add_argument("--format", choices=["llmc", "nanogpt"], default="llmc")
    args = p.parse_args(argv)
    if not 0.0 < args.val_fraction < 1.0:
        raise BadInput(f"--val_fraction {args.val_fraction:g} is outside (0, 1); give the share of "
                       "tokens kept for validation, e.g. 0.1")
    if not 1 <= args.shard_tokens <= LLMC_MAX_SHARD:
        raise BadInput(f"--shard_tokens {args.shard_tokens} is outside 1..{LLMC_MAX_SHARD} "
                       "(llm.c's header holds an int32 count); e.g. 100000000")
    return args


def printable(path):
    """A path as text: bytes that are not UTF-8 (os.fsdecode's surrogates) as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def check_out(out):
    """--out must be new or an empty folder: prepare_text never mixes its shards with other files."""
    if not out:
        raise BadInput("--out is empty; name the new folder for the shards, e.g. --out data/mytext")
    if not os.path.lexists(out):
        ancestor = os.path.dirname(os.path.abspath(out))
        while not os.path.lexists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            raise BadInput(f"--out {printable(out)} lies under {printable(ancestor)}, which is a file, not a folder; "
                           "choose another path")
        return
    if not os.path.isdir(out):
        raise BadInput(f"--out {out} exists and is not a folder; choose a new path")
    held = sorted(os.listdir(out))
    if held:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise BadInput(f"--out {out} already holds {len(held)} file(s) ({shown}); "
                       "choose a new folder or remove this one")


def read_inputs(paths):
    contents = []
    for path in paths:
        if not os.path.exists(path):
            raise BadInput(f"input {path} does not exist; pass the path of a text file")
        if os.path.isdir(path):
            raise BadInput(f"input {path} is a folder; pass the files in it "
                           f"(e.g. $(find {path} -type f | sort))")
        mode = os.stat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            # /dev/zero would be read for ever; a terminal would wait for typing.
            raise BadInput(f"input {path} is a device or socket, not a text file; pass the path of a text file")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise BadInput(f"input {path} cannot be read ({e.strerror}); check its permissions")
        if not data:
            raise BadInput(f"input {path} is empty; remove it from the inputs")
        contents.append(data)
    return contents


def decode_utf8(paths, contents, level):
    texts = []
    for path, data in zip(paths, contents):
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise BadInput(f"input {path} is not UTF-8 text (byte {e.start}: {e.reason}); --level "
                           f"{level} reads UTF-8: convert it (iconv -t UTF-8) or use --level byte")
    return texts


def encode_bytes(contents):
    return np.frombuffer(b"".join(contents), dtype=np.uint8).astype(np.uint16), {}


def encode_chars(texts):
    """nanoGPT's chars = sorted(set(data)), stoi = index: code points sort as Python sorts str."""
    text = "".join(texts)
    codepoints = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    vocab = np.unique(codepoints)
    if len(vocab) > UINT16_VOCAB:
        raise BadInput(f"the inputs hold {len(vocab)} distinct characters, over the {UINT16_VOCAB} "
                       "a uint16 token can index; use --level byte (vocab 256)")
    tokens = np.searchsorted(vocab, codepoints).astype(np.uint16)
    return tokens, {"itos": [chr(c) for c in vocab]}


def tiktoken_cache_dir(tkload):
    """Where tiktoken's read_file_cached looks (tiktoken/load.py)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return os.environ[var]
    default = getattr(tkload, "_default_cache_dir", None)  # newer tiktoken: ~/.cache/tiktoken
    return default() if default else os.path.join(tempfile.gettempdir(), "data-gym-cache")


class _WouldDownload(Exception):
    pass


def gpt2_encoding():
    """tiktoken's GPT-2 encoding from its local cache, refusing the download it would start."""
    try:
        import tiktoken
        import tiktoken.load as tkload
    except ImportError:
        raise BadInput("--level gpt2 needs the Python package tiktoken (.venv/bin/python -m pip "
                       "install tiktoken) and GPT-2's encoding files in its cache; or use --level byte|char")
    read_file = tkload.read_file  # what read_file_cached calls on a cache miss: the download

    def local_only(blobpath):
        if "://" in blobpath:
            raise _WouldDownload(blobpath)
        return read_file(blobpath)

    tkload.read_file = local_only
    try:
        return tiktoken.get_encoding("gpt2")
    except _WouldDownload as e:
        url = str(e)
        folder = tiktoken_cache_dir(tkload)
        if not folder:
            raise BadInput("--level gpt2: TIKTOKEN_CACHE_DIR is empty (tiktoken's cache off), so tiktoken "
                           f"would download {url}; set it to the folder that holds GPT-2's encoding files")
        # GPT-2's encoding is two files side by side: name each one missing, not only the first.
        base, name = url.rsplit("/", 1)
        pair = ("vocab.bpe", "encoder.json")
        blobs = [f"{base}/{n}" for n in pair] if name in pair else [url]
        cached = {b: os.path.join(folder, hashlib.sha1(b.encode()).hexdigest()) for b in blobs}
        missing = [f"{b} as {cached[b]}" for b in blobs if b == url or not os.path.exists(cached[b])]
        raise BadInput("--level gpt2: tiktoken's GPT-2 encoding is not in its cache and prepare_text "
                       f"never downloads; copy {' and '.join(missing)} from a machine "
                       "where tiktoken.get_encoding('gpt2') ran (TIKTOKEN_CACHE_DIR picks the folder)")
    finally:
        tkload.read_file = read_file


def encode_gpt2(texts):
    enc = gpt2_encoding()
    if enc.n_vocab > UINT16_VOCAB:
        raise BadInput(f"tiktoken's gpt2 has {enc.n_vocab} tokens, over the {UINT16_VOCAB} "
                       "a uint16 token can index")
    eot = enc.eot_token
    stream = []
    for text in texts:
        stream.append(eot)  # llm.c's fineweb.py: [eot] + encode_ordinary(doc), the delimiter first
        stream.extend(enc.encode_ordinary(text))
    return np.array(stream, dtype=np.uint16), {"encoding": "gpt2", "eot_token": eot, "vocab_size": enc.n_vocab}


def llmc_pieces(n, shard_tokens):
    """[start, end) of each shard of n tokens: every shard_tokens, a short tail joining the shard before it."""
    starts = list(range(0, n, shard_tokens)) or [0]
    if len(starts) > 1 and n - starts[-1] < shard_tokens / 2 and n - starts[-2] <= LLMC_MAX_SHARD:
        starts.pop()
    return list(zip(starts, starts[1:] + [n]))


def write_llmc(folder, split, tokens, shard_tokens):
    names = []
    for i, (start, end) in enumerate(llmc_pieces(len(tokens), shard_tokens)):
        shard = tokens[start:end]
        header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
        header[:3] = (LLMC_MAGIC, LLMC_VERSION, len(shard))
        names.append(f"{split}_{i:06d}.bin")
        with open(os.path.join(folder, names[-1]), "wb") as f:
            f.write(header.tobytes())
            f.write(shard.astype("<u2").tobytes())
    return names


def write_nanogpt(folder, train, val, level, vocab_size, extra):
    train.astype("<u2").tofile(os.path.join(folder, "train.bin"))
    val.astype("<u2").tofile(os.path.join(folder, "val.bin"))
    if level == "gpt2":
        return ["train.bin", "val.bin"]  # nanoGPT's sample.py falls back to tiktoken's gpt2
    chars = extra["itos"] if level == "char" else [chr(b) for b in range(256)]  # bytes as Latin-1
    meta = {"vocab_size": vocab_size, "itos": dict(enumerate(chars)),
            "stoi": {ch: i for i, ch in enumerate(chars)}}
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump(meta, f)
    return ["train.bin", "val.bin"]


def prepare(args):
    started = time.perf_counter()
    check_out(args.out)
    contents = read_inputs(args.inputs)
    if args.level == "byte":
        tokens, extra = encode_bytes(contents)
        vocab_size = 256
    elif args.level == "char":
        tokens, extra = encode_chars(decode_utf8(args.inputs, contents, "char"))
        vocab_size = len(extra["itos"])
    else:
        tokens, extra = encode_gpt2(decode_utf8(args.inputs, contents, "gpt2"))
        vocab_size = extra.pop("vocab_size")
    del contents

    n = len(tokens)
    n_train = int(n * (1 - args.val_fraction))
    if n_train == 0 or n_train == n:
        raise BadInput(f"{n} token(s) leave {'no train' if n_train == 0 else 'no val'} tokens at "
                       f"--val_fraction {args.val_fraction:g}; give more text or another fraction")
    train, val = tokens[:n_train], tokens[n_train:]

    out = os.path.abspath(args.out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=parent)
    try:
        if args.format == "llmc":
            written = (write_llmc(staging, "train", train, args.shard_tokens)
                       + write_llmc(staging, "val", val, args.shard_tokens))
        else:
            written = write_nanogpt(staging, train, val, args.level, vocab_size, extra)
        meta = {"level": args.level, "vocab_size": vocab_size, "format": args.format,
                "tokens": {"train": len(train), "val": len(val)}, **extra,
                "files": [printable(p) for p in args.inputs]}
        with open(os.path.join(staging, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False, indent=1)
            f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 is for the staging only
        check_out(args.out)  # again: nothing may have appeared there meanwhile
        os.rename(staging, out)  # an empty folder is replaced whole
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shards = (f"{sum(w.startswith('train') for w in written)} train + "
              f"{sum(w.startswith('val') for w in written)} val shard(s)")
    print(f"prepare_text: {len(train):,} train + {len(val):,} val tokens, vocab {vocab_size:,} "
          f"({args.level}), {shards} ({args.format}) in {printable(args.out)}, "
          f"{time.perf_counter() - started:.1f} s")


def main(argv=None):
    try:
        prepare(parse_args(sys.argv[1:] if argv is None else argv))
    except BadInput as e:
        print(f"prepare_text: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"prepare_text: cannot write {e.filename or 'the output'}: {e.strerror}; "
              "check the --out folder's disk space and permissions", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
