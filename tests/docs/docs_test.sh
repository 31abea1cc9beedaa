#!/usr/bin/env bash
# The documentation stays findable and the API reference builds:
#  (a) README.md is a front page (at most 220 lines);
#  (b) every relative link in README.md, CONTRIBUTING.md, ARCHITECTURE.md and docs/*.md points to a
#      file that exists (and, for a #heading of a .md file, to a heading it has, as GitHub names it);
#  (c) ARCHITECTURE.md names every public header of include/ddp/;
#  (d) scripts/docs.sh builds the API reference with Doxygen, any warning an error.
# Usage: docs_test.sh [REPO_ROOT]   (default: the repository this script is in)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || { echo "FAIL: no repository at '$root'" >&2; exit 1; }
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# (a)
readme_lines=$(wc -l < README.md)
if (( readme_lines > 220 )); then
  fail "README.md has $readme_lines lines (at most 220): it is the front page; move the rest into docs/"
fi

# (b)
if ! command -v python3 >/dev/null 2>&1; then
  fail "python3 is not installed (the link check needs it); run scripts/setup.sh"
else
  python3 - README.md CONTRIBUTING.md ARCHITECTURE.md docs/*.md <<'PY' || fail "a relative link points nowhere (the lines above), or python3 failed"
import os, re, sys

def slug(text):
    """The anchor GitHub gives a heading."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text.strip().lower()).replace('`', '')
    return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')

def prose(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fenced = False
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            if line.lstrip().startswith('```'):
                fenced = not fenced
                continue
            if not fenced:
                yield n, line.rstrip('\n')

anchors_of = {}
def anchors(path):
    if path not in anchors_of:
        seen, found = {}, set()
        for _, line in prose(path):
            m = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
            if m:
                s = slug(m.group(1))
                k = seen.get(s, 0)
                seen[s] = k + 1
                found.add(s if k == 0 else f'{s}-{k}')
        anchors_of[path] = found
    return anchors_of[path]

bad = 0
for md in sys.argv[1:]:
    for n, line in prose(md):
        line = re.sub(r'`[^`]*`', '', line)           # links are not inside code spans
        for target in re.findall(r'\]\(([^)\s]+)(?:\s+"[^"]*")?\)', line):
            if re.match(r'^[a-z][a-z0-9+.-]*:', target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(dest):
                print(f'FAIL: {md}:{n}: link to {target}: {dest} does not exist', file=sys.stderr)
                bad += 1
            elif anchor and dest.endswith('.md') and anchor not in anchors(dest):
                print(f'FAIL: {md}:{n}: link to {target}: {dest} has no heading #{anchor}', file=sys.stderr)
                bad += 1
sys.exit(1 if bad else 0)
PY
fi

# (c)
for header in include/ddp/*.h include/ddp/*.h.in; do
  [[ -e $header ]] || continue
  name=$(basename "$header" .in)
  if ! grep -qF "\`$name\`" ARCHITECTURE.md && ! grep -qF "ddp/$name" ARCHITECTURE.md; then
    fail "ARCHITECTURE.md does not name the public header include/ddp/$name; add a line for it under \"The public headers\""
  fi
done

# (d)
if ! command -v doxygen >/dev/null 2>&1; then
  fail "doxygen is not installed, so the API reference cannot be checked; run scripts/setup.sh --docs (it installs Debian's doxygen)"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  if ! DDP_DOCS_DIR="$out" bash scripts/docs.sh; then
    fail "scripts/docs.sh: the API reference does not build without warnings (above)"
  fi
fi

if (( failures > 0 )); then
  echo "docs: $failures check(s) failed" >&2
  exit 1
fi
echo "docs: README.md $readme_lines lines, links, headers in ARCHITECTURE.md and the API reference: ok"
