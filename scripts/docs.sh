#!/usr/bin/env bash
# The API reference: Doxygen over the /// comments of include/ddp/*.h (docs/Doxyfile), into
# $DDP_DOCS_DIR (default build-docs/; open html/index.html). Any Doxygen warning fails it.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v doxygen >/dev/null 2>&1; then
  echo "docs: doxygen is not installed; run scripts/setup.sh --docs (it installs Debian's doxygen)" >&2
  exit 1
fi

export DDP_DOCS_DIR=${DDP_DOCS_DIR:-build-docs}
DDP_VERSION=$(sed -n 's/^project([a-z_]* VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
export DDP_VERSION
mkdir -p "$DDP_DOCS_DIR"
warnings="$DDP_DOCS_DIR/doxygen-warnings.log"

# FAIL_ON_WARNINGS makes doxygen exit non-zero after listing every warning; the log is checked too,
# so a doxygen that only prints a warning still fails here.
status=0
doxygen docs/Doxyfile 2> "$warnings" || status=$?
cat "$warnings" >&2
if [[ $status -ne 0 || -s "$warnings" ]]; then
  echo "docs: doxygen reported $(grep -c . "$warnings" || true) warning line(s) (above, and in $warnings); fix the /// comments in include/ddp" >&2
  exit 1
fi
echo "docs: API reference in $DDP_DOCS_DIR/html/index.html (doxygen $(doxygen --version), no warnings)"
