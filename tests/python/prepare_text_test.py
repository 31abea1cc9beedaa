"""scripts/prepare_text.py against formulas (CTest prepare_text; stdlib + numpy, a few seconds).

    python tests/python/prepare_text_test.py

Every expected value comes from the inputs written here and the formats' definitions (llm.c's
256 x int32 header, nanoGPT's meta.pkl, the split int(n * (1 - val_fraction))), never from the
script's output. The gpt2 level runs against a stand-in tiktoken (a toy encoding written here) so
that the test needs neither the package nor its encoding files; the real corpus check reads
Debian's fortunes (scripts/setup.sh --tests installs it).
"""
import glob
import hashlib
import importlib.util
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "prepare_text.py")
FORTUNES = "/usr/share/games/fortunes"

MAGIC, VERSION, HEADER_BYTES = 20240520, 1, 256 * 4
EOT, N_VOCAB_GPT2 = 50256, 50257
GPT2_URL = "https://example.invalid/gpt-2/encodings/main/"  # the stand-in's "download" address

# A stand-in tiktoken: the cache lookup of tiktoken/load.py (sha1 of the address in
# TIKTOKEN_CACHE_DIR, else read_file = the download) and a toy encoding, one token per UTF-8 byte + 1000.
FAKE_LOAD = '''
import hashlib, os
def read_file(blobpath):
    with open(os.environ["FAKE_DOWNLOAD_LOG"], "a") as f:
        f.write(blobpath + "\\n")
    return b""
def read_file_cached(blobpath):
    path = os.path.join(os.environ["TIKTOKEN_CACHE_DIR"], hashlib.sha1(blobpath.encode()).hexdigest())
    if os.path.exists(path):
        return open(path, "rb").read()
    return read_file(blobpath)
'''
FAKE_INIT = '''
from . import load
class Toy:
    n_vocab, eot_token = %d, %d
    def encode_ordinary(self, text):
        return [b + 1000 for b in text.encode("utf-8")]
def get_encoding(name):
    assert name == "gpt2", name
    for f in ("vocab.bpe", "encoder.json"):
        load.read_file_cached("%s" + f)
    return Toy()
''' % (N_VOCAB_GPT2, EOT, GPT2_URL)


def read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


def put(path, text):
    with open(path, "w") as f:
        f.write(text)


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def toy_gpt2(text):
    return [b + 1000 for b in text.encode("utf-8")]


def read_llmc(path):
    """(header, tokens) of one llm.c shard, checking its size against its count."""
    raw = read(path)
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    tokens = np.frombuffer(raw[HEADER_BYTES:], dtype="<u2")
    assert len(raw) == HEADER_BYTES + 2 * header[2], (path, len(raw), header[2])
    return header, tokens


class PrepareText(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.env = dict(os.environ)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, data):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        return path

    def run_script(self, *args, env=None):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              env=env or self.env, timeout=120)

    def prepare(self, *args, env=None):
        r = self.run_script(*args, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertEqual(len(r.stdout.splitlines()), 1, r.stdout)  # the one summary line
        return r.stdout

    def assert_same(self, got, want):
        """Sequences (tokens, bytes, text) compared cheaply: the first difference, not a difflib diff."""
        got, want = list(got), list(want)
        first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        if len(got) != len(want) or first < len(got):
            self.fail(f"lengths {len(got)} vs {len(want)}; first difference at {first}: "
                      f"{got[first:first + 5]} vs {want[first:first + 5]}")

    def llmc_split(self, out, split):
        shards = sorted(glob.glob(os.path.join(out, f"{split}_*.bin")))
        self.assertEqual([os.path.basename(s) for s in shards],
                         [f"{split}_{i:06d}.bin" for i in range(len(shards))])
        parts = []
        for s in shards:
            header, tokens = read_llmc(s)
            self.assertEqual((header[0], header[1]), (MAGIC, VERSION))
            self.assertEqual(header[2], len(tokens))
            self.assertTrue((header[3:] == 0).all())
            parts.append(tokens)
        return parts

    # --- byte level -------------------------------------------------------------------------------

    def test_byte_round_trip_and_split(self):
        a = b"hello, world\n"
        b = bytes(range(256)) * 3 + b"\xff\xfe not UTF-8"  # bytes are bytes: no decoding
        stream = a + b
        out = os.path.join(self.dir, "out")
        self.prepare(self.write("a.txt", a), self.write("b.bin", b), "--out", out, "--val_fraction", "0.25")
        n_train = int(len(stream) * (1 - 0.25))
        train = np.concatenate(self.llmc_split(out, "train"))
        val = np.concatenate(self.llmc_split(out, "val"))
        self.assert_same(train.tolist(), stream[:n_train])
        self.assert_same(val.tolist(), stream[n_train:])
        meta = load_json(os.path.join(out, "meta.json"))
        self.assertEqual(meta["level"], "byte")
        self.assertEqual(meta["vocab_size"], 256)
        self.assertEqual(meta["tokens"], {"train": n_train, "val": len(stream) - n_train})
        self.assertEqual(meta["files"], [os.path.join(self.dir, "a.txt"), os.path.join(self.dir, "b.bin")])
        self.assertNotIn("itos", meta)
        self.assertEqual(sorted(os.listdir(out)), ["meta.json", "train_000000.bin", "val_000000.bin"])

    def test_shards_split_every_shard_tokens(self):
        text = "".join(chr(ord("a") + i % 26) for i in range(1234)).encode()
        out = os.path.join(self.dir, "out")
        self.prepare(self.write("t.txt", text), "--out", out, "--shard_tokens", "100")
        n_train = int(1234 * 0.9)  # the default --val_fraction 0.1, nanoGPT's int(n*0.9)
        self.assertEqual(n_train, 1110)
        train = self.llmc_split(out, "train")
        val = self.llmc_split(out, "val")
        # 1110 = 11 x 100 + 10: the tail of 10 (< 100 / 2) joins the 11th shard; val 124 = 100 + 24
        # likewise. A tail of half a shard or more stays a shard of its own (1150 + 50 below).
        self.assertEqual([len(p) for p in train], [100] * 10 + [110])
        self.assertEqual(len(train), n_train // 100)
        self.assertEqual([len(p) for p in val], [124])
        self.assert_same(np.concatenate(train + val).tolist(), text)
        for i, part in enumerate(train):  # each shard starts where the previous one stopped
            self.assert_same(part.tolist(), text[100 * i:100 * i + len(part)])
        out2 = os.path.join(self.dir, "out2")
        self.prepare(self.write("u.txt", text[:1200]), "--out", out2, "--shard_tokens", "100",
                     "--val_fraction", "0.5")
        self.assertEqual([len(p) for p in self.llmc_split(out2, "train")], [100] * 6)
        out3 = os.path.join(self.dir, "out3")
        longer = "".join(chr(ord("a") + i % 26) for i in range(1300)).encode()
        self.prepare(self.write("v.txt", longer), "--out", out3, "--shard_tokens", "100",
                     "--val_fraction", "0.5")  # 650 tokens each: the tail of 50 is half a shard
        self.assertEqual([len(p) for p in self.llmc_split(out3, "train")], [100] * 6 + [50])
        self.assertEqual([len(p) for p in self.llmc_split(out3, "val")], [100] * 6 + [50])

    # --- char level -------------------------------------------------------------------------------

    def test_char_itos_stoi_round_trip_llmc(self):
        texts = ["To be, or not to be:\nthat is the question.\n", "naïve café ✓ 日本語 – ok\r\n"]
        whole = "".join(texts)
        itos = sorted(set(whole))  # nanoGPT: chars = sorted(list(set(data)))
        stoi = {ch: i for i, ch in enumerate(itos)}
        out = os.path.join(self.dir, "out")
        paths = [self.write(f"{i}.txt", t) for i, t in enumerate(texts)]
        self.prepare(*paths, "--out", out, "--level", "char", "--val_fraction", "0.3")
        meta = load_json(os.path.join(out, "meta.json"))
        self.assertEqual(meta["level"], "char")
        self.assertEqual(meta["vocab_size"], len(itos))
        self.assert_same(meta["itos"], itos)
        n_train = int(len(whole) * (1 - 0.3))  # characters, not bytes
        self.assertEqual(meta["tokens"], {"train": n_train, "val": len(whole) - n_train})
        train = np.concatenate(self.llmc_split(out, "train"))
        val = np.concatenate(self.llmc_split(out, "val"))
        self.assert_same(train.tolist(), [stoi[c] for c in whole[:n_train]])
        self.assert_same("".join(meta["itos"][t] for t in np.concatenate([train, val])), whole)

    def test_char_nanogpt_format_as_shakespeare_char(self):
        text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 5
        out = os.path.join(self.dir, "out")
        self.prepare(self.write("input.txt", text), "--out", out, "--level", "char", "--format", "nanogpt")
        chars = sorted(list(set(text)))
        n = len(text)
        self.assertEqual(sorted(os.listdir(out)), ["meta.json", "meta.pkl", "train.bin", "val.bin"])
        with open(os.path.join(out, "meta.pkl"), "rb") as f:
            meta = pickle.load(f)
        self.assertEqual(meta, {"vocab_size": len(chars),
                                "itos": {i: ch for i, ch in enumerate(chars)},
                                "stoi": {ch: i for i, ch in enumerate(chars)}})
        train = np.fromfile(os.path.join(out, "train.bin"), dtype="<u2")  # raw uint16, no header
        val = np.fromfile(os.path.join(out, "val.bin"), dtype="<u2")
        self.assertEqual(os.path.getsize(os.path.join(out, "train.bin")), 2 * int(n * 0.9))
        self.assert_same("".join(meta["itos"][int(i)] for i in train), text[:int(n * 0.9)])
        self.assert_same("".join(meta["itos"][int(i)] for i in val), text[int(n * 0.9):])

    def test_byte_nanogpt_meta_is_latin1(self):
        data = "naïve – ok\n".encode("utf-8") * 4
        out = os.path.join(self.dir, "out")
        self.prepare(self.write("t.txt", data), "--out", out, "--format", "nanogpt")
        with open(os.path.join(out, "meta.pkl"), "rb") as f:
            meta = pickle.load(f)
        self.assertEqual(meta, {"vocab_size": 256, "itos": {i: chr(i) for i in range(256)},
                                "stoi": {chr(i): i for i in range(256)}})
        tokens = np.concatenate([np.fromfile(os.path.join(out, f"{s}.bin"), dtype="<u2") for s in ("train", "val")])
        self.assertEqual(len(np.fromfile(os.path.join(out, "train.bin"), dtype="<u2")), int(len(data) * 0.9))
        self.assert_same("".join(meta["itos"][int(t)] for t in tokens).encode("latin-1"), data)

    def test_char_vocab_of_65536_fits_uint16(self):
        # Every id 0..65535 is a uint16; code points from U+0100 on, the surrogates left out.
        chars = [chr(c) for c in range(0x100, 0x100 + 65536 + 2048) if not 0xD800 <= c <= 0xDFFF][:65536]
        out = os.path.join(self.dir, "out")
        self.prepare(self.write("wide.txt", "".join(chars)), "--out", out, "--level", "char")
        meta = load_json(os.path.join(out, "meta.json"))
        self.assertEqual(meta["vocab_size"], 65536)
        tokens = np.concatenate(self.llmc_split(out, "train") + self.llmc_split(out, "val"))
        self.assert_same(tokens.tolist(), range(65536))  # the chars are in sorted order

    # --- gpt2 level (a stand-in tiktoken) ---------------------------------------------------------

    def fake_tiktoken(self, cache_files):
        pkg = os.path.join(self.dir, "fake", "tiktoken")
        os.makedirs(pkg)
        put(os.path.join(pkg, "__init__.py"), FAKE_INIT)
        put(os.path.join(pkg, "load.py"), FAKE_LOAD)
        cache = os.path.join(self.dir, "cache")
        os.makedirs(cache)
        paths = {f: os.path.join(cache, hashlib.sha1((GPT2_URL + f).encode()).hexdigest())
                 for f in ("vocab.bpe", "encoder.json")}
        for f in cache_files:
            open(paths[f], "wb").close()
        log = os.path.join(self.dir, "downloads.log")
        env = dict(self.env, PYTHONPATH=os.path.join(self.dir, "fake"), TIKTOKEN_CACHE_DIR=cache,
                   FAKE_DOWNLOAD_LOG=log)
        return env, paths, log

    def test_gpt2_eot_before_each_document(self):
        env, _, log = self.fake_tiktoken(["vocab.bpe", "encoder.json"])
        docs = ["First document.\n", "Second one, ünïcode.\n", "Third."]
        out = os.path.join(self.dir, "out")
        self.prepare(*[self.write(f"d{i}.txt", d) for i, d in enumerate(docs)], "--out", out,
                     "--level", "gpt2", env=env)
        stream = [t for d in docs for t in [EOT] + toy_gpt2(d)]  # llm.c: [eot] + encode_ordinary(doc)
        n_train = int(len(stream) * 0.9)
        self.assert_same(np.concatenate(self.llmc_split(out, "train")).tolist(), stream[:n_train])
        self.assert_same(np.concatenate(self.llmc_split(out, "val")).tolist(), stream[n_train:])
        meta = load_json(os.path.join(out, "meta.json"))
        self.assertEqual((meta["level"], meta["encoding"], meta["vocab_size"]), ("gpt2", "gpt2", N_VOCAB_GPT2))
        self.assertFalse(os.path.exists(log))  # nothing downloaded
        nano = os.path.join(self.dir, "nano")  # nanoGPT's openwebtext: no meta.pkl, sample.py uses tiktoken
        self.prepare(*[os.path.join(self.dir, f"d{i}.txt") for i in range(3)], "--out", nano,
                     "--level", "gpt2", "--format", "nanogpt", env=env)
        self.assertEqual(sorted(os.listdir(nano)), ["meta.json", "train.bin", "val.bin"])
        self.assert_same(np.fromfile(os.path.join(nano, "train.bin"), dtype="<u2").tolist(), stream[:n_train])

    # --- streaming: a chunk at a time -------------------------------------------------------------

    def test_chunks_of_five_bytes_give_the_same_shards(self):
        """Read 5 bytes at a time, every boundary is crossed: UTF-8 characters cut in two, shards
        filled across chunks, documents encoded in parts; the tokens are the formulas' all the same."""
        texts = ["naïve café ✓ 日本語 – ok\r\n", "To be,\nor not\n\n to be:\nthat 🙂 is\nthe question.\n" * 3]
        whole = "".join(texts)
        paths = [self.write(f"c{i}.txt", t) for i, t in enumerate(texts)]
        env, _, _ = self.fake_tiktoken(["vocab.bpe", "encoder.json"])
        env["PREPARE_TEXT_CHUNK_BYTES"] = "5"
        itos = sorted(set(whole))
        streams = {"byte": list(whole.encode("utf-8")), "char": [itos.index(c) for c in whole],
                   "gpt2": [t for d in texts for t in [EOT] + toy_gpt2(d)]}
        for level, stream in streams.items():
            n_train = int(len(stream) * 0.9)
            with self.subTest(level=level):
                out = os.path.join(self.dir, f"{level}_llmc")
                self.prepare(*paths, "--out", out, "--level", level, "--shard_tokens", "7", env=env)
                train, val = self.llmc_split(out, "train"), self.llmc_split(out, "val")
                # Every 7 tokens a shard; a tail shorter than 7 / 2 joins the shard before it.
                tail = n_train % 7
                sizes = [7] * (n_train // 7 - (tail < 3.5)) + [7 + tail if tail < 3.5 else tail]
                self.assertEqual([len(p) for p in train], sizes)
                self.assert_same(np.concatenate(train).tolist(), stream[:n_train])
                self.assert_same(np.concatenate(val).tolist(), stream[n_train:])
                out = os.path.join(self.dir, f"{level}_nanogpt")
                self.prepare(*paths, "--out", out, "--level", level, "--format", "nanogpt", env=env)
                self.assert_same(np.fromfile(os.path.join(out, "train.bin"), dtype="<u2").tolist(), stream[:n_train])
                self.assert_same(np.fromfile(os.path.join(out, "val.bin"), dtype="<u2").tolist(), stream[n_train:])
        # A bad byte after a character the chunk cut in two: its offset in the file, not in the chunk.
        data = "abcé".encode() + b"defghij" + b"\xff" + b"tail"  # 0xFF at byte 12; bytes 3-4 are é
        bad = self.write("bad.txt", data)
        for level in ("char", "gpt2"):
            self.assert_refused([bad, "--level", level], bad, "not UTF-8", "byte 12", env=env)

    def test_gpt2_documents_cut_only_where_bpe_cannot_tell(self):
        """A long document goes to the encoder in parts cut before a newline (or \\r, \\t) that a
        non-space follows: GPT-2's pattern makes it a piece of its own, so encoding the parts gives the
        whole's tokens (checked once with the regex module on the fortunes, as they are, with CRLF
        line ends and with every newline doubled: 134694 cuts each, the same pieces; cutting after
        every newline gives other pieces)."""
        spec = importlib.util.spec_from_file_location("prepare_text", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        doc = ("One line.\nTwo  \nthree\n\nfour\n five\nsix\tseven\nend" * 4
               + "Windows\r\nline\r\n\r\nends\r\n" * 4)  # CRLF and blank lines: cut too, not held whole
        path = self.write("doc.txt", doc)
        given = []

        class Recorder:
            eot_token = 7

            def encode_ordinary(self, text):
                given.append(text)
                return [ord(c) for c in text]

        os.environ["PREPARE_TEXT_CHUNK_BYTES"] = "6"
        try:
            tokens = np.concatenate(list(module.gpt2_tokens([path], Recorder()))).tolist()
        finally:
            del os.environ["PREPARE_TEXT_CHUNK_BYTES"]
        self.assertEqual(tokens, [7] + [ord(c) for c in doc])
        self.assertEqual("".join(given), doc)
        self.assertGreater(len(given), 8)  # parts, not the whole document at once
        self.assertTrue(any("\r" in part for part in given[1:-1]), given)
        for following in given[1:]:  # each part after the first starts with \n, \r or \t, then a non-space
            self.assertTrue(following[0] in "\n\r\t\v\f" and not following[1].isspace(), following)

    def test_a_pipe_is_read_once(self):
        """<(zcat corpus.gz) or a FIFO: read once (copied first), the tokens those of its text."""
        text = "piped text, read once\n" * 50
        fifo = os.path.join(self.dir, "pipe")
        os.mkfifo(fifo)
        writer = subprocess.Popen(["/bin/sh", "-c", f'printf "%s" "$0" > {fifo}', text])
        out = os.path.join(self.dir, "out")
        self.prepare(fifo, "--out", out, "--level", "char")
        writer.wait(timeout=30)
        itos = sorted(set(text))
        n_train = int(len(text) * 0.9)
        tokens = np.concatenate(self.llmc_split(out, "train") + self.llmc_split(out, "val"))
        self.assert_same(tokens.tolist(), [itos.index(c) for c in text])
        self.assertEqual(load_json(os.path.join(out, "meta.json"))["tokens"], {"train": n_train, "val": len(text) - n_train})

    def test_memory_does_not_grow_with_the_input(self):
        """Peak memory (the script's VmHWM) for 24 MB of text stays within a few MB of that for
        a few KB: the inputs are read a chunk at a time (256 KiB here; reading them whole took ~16 x
        their size)."""
        line = "The quick brown fox – naïve café – jumps over the lazy dog 1234567890.\n"
        big = self.write("big.txt", line * (24_000_000 // len(line.encode())))
        small = self.write("small.txt", line * 100)
        # VmHWM, the process's own peak (ru_maxrss would keep the spawning test's from before exec).
        probe = ("import runpy, sys; sys.argv = sys.argv[1:]\n"
                 "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
                 "except SystemExit as e:\n    assert not e.code, e.code\n"
                 "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0],"
                 " file=sys.stderr)\n")
        peak = {}
        for level in ("byte", "char"):
            for name, path in (("small", small), ("big", big)):
                r = subprocess.run([sys.executable, "-c", probe, SCRIPT, path, "--out",
                                    os.path.join(self.dir, f"{level}_{name}"), "--level", level],
                                   capture_output=True, text=True, timeout=120,
                                   env=dict(self.env, PREPARE_TEXT_CHUNK_BYTES=str(1 << 18)))
                self.assertEqual(r.returncode, 0, r.stderr)
                peak[level, name] = int(r.stderr.split()[-1]) * 1024  # KiB on Linux
            growth = peak[level, "big"] - peak[level, "small"]
            self.assertLess(growth, os.path.getsize(big) / 2, (level, peak))

    # --- bad input: one line, exit 2, nothing written ---------------------------------------------

    def assert_refused(self, args, *words, env=None, out=None):
        out = out or os.path.join(self.dir, "out")
        parent = os.path.dirname(out)
        before = sorted(os.listdir(parent)) if os.path.isdir(parent) else None
        held = sorted(os.listdir(out)) if os.path.isdir(out) else None
        r = self.run_script(*args, "--out", out, env=env)
        self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
        self.assertEqual(r.stdout, "")
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("prepare_text: "), lines[0])
        for w in words:
            self.assertIn(w, lines[0])
        after = sorted(os.listdir(parent)) if os.path.isdir(parent) else None
        self.assertEqual(after, before)  # no out, no staging folder left beside it
        if held is not None:
            self.assertEqual(sorted(os.listdir(out)), held)
        return lines[0]

    def test_bad_inputs(self):
        good = self.write("good.txt", "plenty of text here\n" * 10)
        missing = os.path.join(self.dir, "nope.txt")
        empty = self.write("empty.txt", b"")
        latin1 = self.write("latin1.txt", "caf\u00e9 ok".encode("latin-1"))  # 0xE9 then a space: invalid UTF-8
        cases = [
            ([good, missing], [missing, "does not exist"]),
            ([good, empty], [empty, "empty"]),
            ([latin1, "--level", "char"], [latin1, "not UTF-8", "byte 3", "--level byte"]),
            ([latin1, "--level", "gpt2"], [latin1, "not UTF-8"]),
            ([good, "--val_fraction", "0"], ["--val_fraction 0", "(0, 1)"]),
            ([good, "--val_fraction", "1"], ["--val_fraction 1", "(0, 1)"]),
            ([good, "--val_fraction", "-0.1"], ["--val_fraction -0.1"]),
            ([good, "--val_fraction", "1.5"], ["--val_fraction 1.5"]),
            ([good, "--val_fraction", "lots"], ["--val_fraction"]),
            ([good, "--shard_tokens", "0"], ["--shard_tokens 0"]),
            ([good, "--level", "word"], ["--level"]),
            ([self.write("one.txt", "x"), "--val_fraction", "0.1"], ["1 token(s)", "no train"]),
            ([self.dir], [self.dir, "folder"]),
            # A device is refused before it is read (/dev/zero would be read until memory runs out).
            ([good, "/dev/null"], ["/dev/null", "device"]),
        ]
        for args, words in cases:
            with self.subTest(args=args):
                self.assert_refused(args, *words)
        r = self.run_script(good, "--out", "")
        self.assertEqual((r.returncode, r.stdout), (2, ""), r.stderr)
        self.assertEqual(r.stderr.splitlines(), [
            "prepare_text: --out is empty; name the new folder for the shards, e.g. --out data/mytext"])
        self.assert_refused([good], good, "is a file, not a folder", out=os.path.join(good, "x", "y"))
        # The byte level takes any bytes: the same Latin-1 file is fine there.
        self.prepare(latin1, "--out", os.path.join(self.dir, "bytes_ok"))

    def test_file_names_that_are_not_utf8(self):
        """meta.json lists such a name with \\xNN escapes (JSON cannot hold the raw bytes)."""
        name = os.fsdecode(b"caf\xe9.txt")  # Latin-1 bytes in the name
        path = self.write(name, "plenty of text here\n" * 10)
        out = os.path.join(self.dir, os.fsdecode(b"out\xff"))
        self.prepare(path, "--out", out)
        self.assertEqual(load_json(os.path.join(out, "meta.json"))["files"],
                         [os.path.join(self.dir, "caf\\xe9.txt")])

    def test_out_holding_other_files_is_left_alone(self):
        good = self.write("good.txt", "plenty of text here\n" * 10)
        out = os.path.join(self.dir, "busy")
        os.makedirs(out)
        self.write("busy/notes.txt", "mine")
        self.assert_refused([good], out, "notes.txt", "new folder", out=out)
        self.assertEqual(read(os.path.join(out, "notes.txt"), "r"), "mine")
        self.assert_refused([good], "not a folder", out=good)
        os.makedirs(os.path.join(self.dir, "empty_out"))  # an empty folder is fine
        self.prepare(good, "--out", os.path.join(self.dir, "empty_out"))
        self.assertIn("meta.json", os.listdir(os.path.join(self.dir, "empty_out")))
        # A link to an empty folder: the shards go into that folder, the link stays (it failed with
        # "cannot write .../.linked.XXXX.tmp: Not a directory", blaming the disk).
        os.makedirs(os.path.join(self.dir, "real_out"))
        os.symlink(os.path.join(self.dir, "real_out"), os.path.join(self.dir, "linked"))
        self.prepare(good, "--out", os.path.join(self.dir, "linked"))
        self.assertTrue(os.path.islink(os.path.join(self.dir, "linked")))
        self.assertIn("meta.json", os.listdir(os.path.join(self.dir, "real_out")))

    def test_vocab_over_uint16_refused(self):
        chars = [chr(c) for c in range(0x100, 0x100 + 65537 + 2048) if not 0xD800 <= c <= 0xDFFF][:65537]
        wide = self.write("wide.txt", "".join(chars))
        self.assert_refused([wide, "--level", "char"], "65537 distinct characters", "--level byte")

    def test_gpt2_without_tiktoken_or_its_files(self):
        # No package: a tiktoken that fails to import, whatever the machine has installed.
        nopkg = os.path.join(self.dir, "nopkg", "tiktoken")
        os.makedirs(nopkg)
        put(os.path.join(nopkg, "__init__.py"), "raise ImportError('No module named tiktoken')\n")
        good = self.write("good.txt", "plenty of text here\n" * 10)
        env = dict(self.env, PYTHONPATH=os.path.dirname(nopkg))
        self.assert_refused([good, "--level", "gpt2"], "tiktoken", "pip install tiktoken", env=env)
        # The package without encoder.json in its cache: the file and where it goes are named, no download.
        env, paths, log = self.fake_tiktoken(["vocab.bpe"])
        line = self.assert_refused([good, "--level", "gpt2"], GPT2_URL + "encoder.json", paths["encoder.json"],
                                   env=env)
        self.assertNotIn(paths["vocab.bpe"], line)
        self.assertFalse(os.path.exists(log))
        os.remove(paths["vocab.bpe"])  # neither file: both named
        self.assert_refused([good, "--level", "gpt2"], paths["vocab.bpe"], paths["encoder.json"], env=env)
        self.assertFalse(os.path.exists(log))

    # --- the real corpus --------------------------------------------------------------------------

    def test_fortunes_corpus_char_level(self):
        files = sorted(p for p in glob.glob(os.path.join(FORTUNES, "*"))
                       if os.path.isfile(p) and not os.path.islink(p) and not p.endswith(".dat"))
        self.assertTrue(files, f"no fortune files in {FORTUNES}: run scripts/setup.sh --tests (Debian's fortunes)")
        text = "".join(read(p).decode("utf-8") for p in files)
        itos = sorted(set(text))
        out = os.path.join(self.dir, "fortunes")
        self.prepare(*files, "--out", out, "--level", "char")
        meta = load_json(os.path.join(out, "meta.json"))
        n_train = int(len(text) * 0.9)
        self.assertEqual(meta["vocab_size"], len(itos))
        self.assert_same(meta["itos"], itos)
        self.assertEqual(meta["tokens"], {"train": n_train, "val": len(text) - n_train})
        self.assertGreater(len(text), 2_000_000)  # a few MB of English, not a sample
        tokens = np.concatenate(self.llmc_split(out, "train") + self.llmc_split(out, "val"))
        lut = np.array([ord(c) for c in itos], dtype=np.uint32)
        self.assert_same(lut[tokens].astype("<u4").tobytes().decode("utf-32-le"), text)


if __name__ == "__main__":
    unittest.main(verbosity=1)
