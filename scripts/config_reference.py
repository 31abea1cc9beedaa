#!/usr/bin/env python3
"""The defaults of docs/configuration.md, from the worker's own key table.

The defaults live in one place, the worker's WorkerConfig (worker/config/config.h): `worker
--config-keys` prints every key and its default. This script fills the default column of every row
of docs/configuration.md's key table from it (a row names its keys in backticks in its first cell;
a row whose default cell is blank is prose, left alone) and checks that every key has a row and
that no row names a key the worker does not have.

Usage: config_reference.py WORKER [--check] [--doc docs/configuration.md]
  --check: exit 1 with a diff when the file is not what the worker says (CTest config_reference);
  without it the file is rewritten.
"""
import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

KEY_TOKEN = re.compile(r"`([a-z_]+(?:\.[a-z_0-9]+)*)`")


def worker_defaults(worker):
    out = subprocess.run([worker, "--config-keys"], check=True, capture_output=True, text=True).stdout
    defaults = {}
    for line in out.splitlines():
        key, _, value = line.partition("\t")
        defaults[key] = value
    if not defaults:
        sys.exit(f"config_reference: {worker} --config-keys printed no keys")
    return defaults


def shown(value):
    # A string default that is empty means "not set"; every other value as YAML writes it.
    return "empty" if value in ("", "''", '""') else f"`{value}`"


def regenerate(text, defaults):
    lines = text.split("\n")
    covered, errors = set(), []
    for i, line in enumerate(lines):
        if not line.startswith("| `"):
            continue
        cells = line.split(" | ", 2)
        if len(cells) < 3:
            continue
        first, default, rest = cells[0][2:], cells[1], cells[2]
        named = KEY_TOKEN.findall(first)
        keys = [k for k in named if k in defaults]
        stale = [k for k in named if k not in defaults and "." in k]
        if stale:
            errors.append(f"line {i + 1}: {', '.join(stale)} is not a key of the worker (worker --config-keys)")
        if not default.strip() or not keys:
            continue  # prose about a key (its default is in its own row)
        covered.update(keys)
        lines[i] = f"| {first} | {', '.join(shown(defaults[k]) for k in keys)} | {rest}"
    missing = [k for k in defaults if k not in covered]
    if missing:
        errors.append("keys without a row in the table: " + ", ".join(missing))
    return "\n".join(lines), errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("worker")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--doc", default=str(Path(__file__).resolve().parent.parent / "docs" / "configuration.md"))
    args = parser.parse_args()
    doc = Path(args.doc)
    text = doc.read_text()
    new, errors = regenerate(text, worker_defaults(args.worker))
    for e in errors:
        print(f"config_reference: {doc}: {e}", file=sys.stderr)
    if errors:
        return 1
    if new == text:
        print(f"ok: {doc} shows the worker's {len(worker_defaults(args.worker))} keys and their defaults")
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(doc), "regenerated"))
        print(f"config_reference: {doc} is not current; run: python3 scripts/config_reference.py <build>/worker",
              file=sys.stderr)
        return 1
    doc.write_text(new)
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
