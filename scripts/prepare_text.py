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

Memory: the inputs are read a chunk at a time (1 MiB), so a corpus of any size takes ~50 MB (the char
level reads them twice: once for the vocabulary; a pipe, <(zcat x.gz), is copied to $TMPDIR first); the gpt2 level writes its tokens to a scratch file
in the staging folder and cuts the shards from it (the disk holds the tokens twice for a while), and
gives tiktoken a long document in parts cut where GPT-2's BPE gives the same tokens (safe_cut).

Bad input (a missing, empty or, for char/gpt2, non-UTF-8 input; --val_fraction outside (0, 1); an
--out holding files; a vocabulary too large for uint16) is one line on stderr and exit 2, with
nothing written: the output goes to a temporary folder beside DIR, renamed to DIR at the end.
"""
import argparse
import codecs
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


def chunk_bytes():
    """Bytes read (and tokens written) at a time: memory stays near a few chunks whatever the corpus's
    size. PREPARE_TEXT_CHUNK_BYTES sets it (the tests use a few bytes to cross every boundary)."""
    return max(1, int(os.environ.get("PREPARE_TEXT_CHUNK_BYTES", 1 << 20)))


# An input that can be read once only (a pipe: <(zcat corpus.gz), a FIFO) is copied to a file first,
# a chunk at a time, and read from there: user path -> the copy.
SPOOLED = {}


def readable(path):
    return SPOOLED.get(path, path)


def spool(path, folder):
    copy = os.path.join(folder, f"input_{len(SPOOLED)}")
    try:
        with open(path, "rb") as src, open(copy, "wb") as dst:
            shutil.copyfileobj(src, dst, chunk_bytes())
    except OSError as e:
        raise BadInput(f"input {path} cannot be read ({e.strerror}); check its permissions")
    SPOOLED[path] = copy


def check_inputs(paths, scratch):
    """Every input is a readable, non-empty file (a pipe is copied into `scratch` first): checked before
    anything is written."""
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
        if stat.S_ISFIFO(mode) and path not in SPOOLED:
            spool(path, scratch)
        try:
            with open(readable(path), "rb") as f:
                empty = not f.read(1)
        except OSError as e:
            raise BadInput(f"input {path} cannot be read ({e.strerror}); check its permissions")
        if empty:
            raise BadInput(f"input {path} is empty; remove it from the inputs")


def byte_chunks(path):
    try:
        with open(readable(path), "rb") as f:
            while chunk := f.read(chunk_bytes()):
                yield chunk
    except OSError as e:
        raise BadInput(f"input {path} cannot be read ({e.strerror}); check its permissions")


def text_chunks(path, level):
    """The file's UTF-8 text, a chunk at a time (a character cut by a chunk's end waits for the next)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes of the file given to the decoder before this chunk
    chunks = byte_chunks(path)
    while True:
        chunk = next(chunks, None)
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(chunk or b"", final=chunk is None)
        except UnicodeDecodeError as e:
            raise BadInput(f"input {path} is not UTF-8 text (byte {offset - pending + e.start}: {e.reason}); "
                           f"--level {level} reads UTF-8: convert it (iconv -t UTF-8) or use --level byte")
        if text:
            yield text
        if chunk is None:
            return
        offset += len(chunk)


def codepoints(text):
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def char_vocabulary(paths):
    """nanoGPT's chars = sorted(set(data)) (code points sort as Python sorts str) and the text's length."""
    vocab, n = np.zeros(0, dtype="<u4"), 0
    for path in paths:
        for text in text_chunks(path, "char"):
            cps = codepoints(text)
            vocab = np.union1d(vocab, np.unique(cps))
            n += len(cps)
    if len(vocab) > UINT16_VOCAB:
        raise BadInput(f"the inputs hold {len(vocab)} distinct characters, over the {UINT16_VOCAB} "
                       "a uint16 token can index; use --level byte (vocab 256)")
    return vocab, n


def byte_tokens(paths):
    for path in paths:
        for chunk in byte_chunks(path):
            yield np.frombuffer(chunk, dtype=np.uint8).astype("<u2")


def char_tokens(paths, vocab):
    token_of = np.zeros(int(vocab[-1]) + 1, dtype="<u2")  # code point -> its index in the vocabulary
    token_of[vocab] = np.arange(len(vocab))
    for path in paths:
        for text in text_chunks(path, "char"):
            yield token_of[codepoints(text)]


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


CUT_BEFORE = "\n\r\t\v\f"  # whitespace that no GPT-2 piece glues to the word after it (a space does: " word")


def safe_cut(text, start=1):
    """Where a text may be cut so that GPT-2's BPE encodes the two parts as it would the whole: before
    the last character of a whitespace run when that character is a newline, tab or the like and a
    non-space follows (tiktoken's encode_ordinary splits the text with GPT-2's pattern, then merges
    within each piece: whole, the run's last character is a piece of its own, `\\s+` after
    `\\s+(?!\\S)` took the rest; cut, the rest ends the first part, the same piece, and the
    second part starts with the same one). Searched from the end down to `start`; 0 when none."""
    for i in range(len(text) - 2, max(start, 1) - 1, -1):
        if text[i] in CUT_BEFORE and not text[i + 1].isspace():
            return i
    return 0


def gpt2_tokens(paths, enc):
    """llm.c's fineweb.py stream, [eot] + encode_ordinary(doc) for each input, a chunk at a time."""
    for path in paths:
        yield np.array([enc.eot_token], dtype="<u2")
        held = ""
        for text in text_chunks(path, "gpt2"):
            searched = len(held)  # held holds no cut: only the new text (and its seam) is searched
            held += text
            if cut := safe_cut(held, searched - 1):
                yield np.array(enc.encode_ordinary(held[:cut]), dtype="<u2")
                held = held[cut:]
        if held:
            yield np.array(enc.encode_ordinary(held), dtype="<u2")


class ShardWriter:
    """Writes a stream of tokens into the output files in order: each (name, token count, llm.c
    header or not) is filled, then the next is opened."""

    def __init__(self, folder, files):
        self.folder, self.files, self.f, self.left = folder, list(files), None, 0

    def write(self, tokens):
        while len(tokens):
            if self.left == 0:
                self._next()
            take = tokens[:self.left]
            self.f.write(take.astype("<u2").tobytes())
            self.left -= len(take)
            tokens = tokens[len(take):]

    def _next(self):
        if self.f:
            self.f.close()
        name, count, header = self.files.pop(0)
        self.f = open(os.path.join(self.folder, name), "wb")
        if header:
            ints = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
            ints[:3] = (LLMC_MAGIC, LLMC_VERSION, count)
            self.f.write(ints.tobytes())
        self.left = count

    def close(self):
        if self.f:
            self.f.close()
        assert self.left == 0 and not self.files, (self.left, self.files)


def llmc_pieces(n, shard_tokens):
    """[start, end) of each shard of n tokens: every shard_tokens, a short tail joining the shard before it."""
    starts = list(range(0, n, shard_tokens)) or [0]
    if len(starts) > 1 and n - starts[-1] < shard_tokens / 2 and n - starts[-2] <= LLMC_MAX_SHARD:
        starts.pop()
    return list(zip(starts, starts[1:] + [n]))


def output_files(fmt, n_train, n_val, shard_tokens):
    """(name, token count, llm.c header or not) of every token file, in the stream's order."""
    if fmt == "nanogpt":
        return [("train.bin", n_train, False), ("val.bin", n_val, False)]
    return [(f"{split}_{i:06d}.bin", end - start, True)
            for split, n in (("train", n_train), ("val", n_val))
            for i, (start, end) in enumerate(llmc_pieces(n, shard_tokens))]


def write_nanogpt_meta(folder, level, vocab_size, extra):
    if level == "gpt2":
        return  # nanoGPT's sample.py falls back to tiktoken's gpt2 (as its openwebtext: no meta.pkl)
    chars = extra["itos"] if level == "char" else [chr(b) for b in range(256)]  # bytes as Latin-1
    meta = {"vocab_size": vocab_size, "itos": dict(enumerate(chars)),
            "stoi": {ch: i for i, ch in enumerate(chars)}}
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump(meta, f)


def split_sizes(n, val_fraction):
    n_train = int(n * (1 - val_fraction))
    if n_train == 0 or n_train == n:
        raise BadInput(f"{n} token(s) leave {'no train' if n_train == 0 else 'no val'} tokens at "
                       f"--val_fraction {val_fraction:g}; give more text or another fraction")
    return n_train, n - n_train


def prepare(args):
    """The inputs a chunk at a time: the byte level reads them once (its token count is their size),
    the char level twice (the vocabulary first), the gpt2 level twice (a UTF-8 check, then the encoding
    into a scratch file that is cut into the shards). A pipe is copied to $TMPDIR first."""
    started = time.perf_counter()
    check_out(args.out)
    scratch = tempfile.mkdtemp(prefix="prepare_text.")  # pipes' copies, removed at the end
    try:
        return prepare_inputs(args, started, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def prepare_inputs(args, started, scratch):
    check_inputs(args.inputs, scratch)
    extra, n, scratch = {}, None, None
    if args.level == "byte":
        vocab_size, n = 256, sum(os.path.getsize(readable(p)) for p in args.inputs)
        stream = lambda: byte_tokens(args.inputs)
    elif args.level == "char":
        vocab, n = char_vocabulary(args.inputs)
        vocab_size, extra = len(vocab), {"itos": [chr(c) for c in vocab]}
        stream = lambda: char_tokens(args.inputs, vocab)
    else:
        for path in args.inputs:  # the text is checked before tiktoken is looked for, or anything written
            for _ in text_chunks(path, "gpt2"):
                pass
        enc = gpt2_encoding()
        if enc.n_vocab > UINT16_VOCAB:
            raise BadInput(f"tiktoken's gpt2 has {enc.n_vocab} tokens, over the {UINT16_VOCAB} "
                           "a uint16 token can index")
        vocab_size, extra = enc.n_vocab, {"encoding": "gpt2", "eot_token": enc.eot_token}
    if n is not None:
        n_train, n_val = split_sizes(n, args.val_fraction)

    out = os.path.realpath(args.out)  # a link to an empty folder: that folder (a link cannot be renamed over)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=parent)
    try:
        if args.level == "gpt2":
            scratch = os.path.join(staging, "tokens.scratch")
            with open(scratch, "wb") as f:
                for tokens in gpt2_tokens(args.inputs, enc):
                    f.write(tokens.tobytes())
            n = os.path.getsize(scratch) // 2
            n_train, n_val = split_sizes(n, args.val_fraction)
            held = np.memmap(scratch, dtype="<u2", mode="r")
            step = max(1, chunk_bytes() // 2)
            stream = lambda: (held[i:i + step] for i in range(0, n, step))
        files = output_files(args.format, n_train, n_val, args.shard_tokens)
        writer = ShardWriter(staging, files)
        for tokens in stream():
            writer.write(tokens)
        writer.close()
        if scratch:
            del held
            os.remove(scratch)
        if args.format == "nanogpt":
            write_nanogpt_meta(staging, args.level, vocab_size, extra)
        meta = {"level": args.level, "vocab_size": vocab_size, "format": args.format,
                "tokens": {"train": n_train, "val": n_val}, **extra,
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
    shards = (f"{sum(f[0].startswith('train') for f in files)} train + "
              f"{sum(f[0].startswith('val') for f in files)} val shard(s)")
    print(f"prepare_text: {n_train:,} train + {n_val:,} val tokens, vocab {vocab_size:,} "
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
