#!/usr/bin/env bash
# libddp.so exports what include/ddp declares and nothing else (libddp/libddp.map): every exported
# symbol must belong to a class or function named at namespace level in the public headers.
# Usage: exports_test.sh LIBDDP INCLUDE_DDP_DIR
set -euo pipefail
lib=$1 headers=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

# The public names: namespace-level classes/structs and non-inline functions of the headers.
names=$(sed -nE -e 's/^(class|struct) ([A-Za-z_][A-Za-z0-9_]*).*/\2/p' \
                -e '/^(inline|template|static|#)/!s/^[A-Za-z_][A-Za-z0-9_:<>&* ]* ([A-Za-z_][A-Za-z0-9_]*)\(.*/\1/p' \
                "$headers"/*.h | sort -u)
[[ "$names" == *initProcessGroup* && "$names" == *DdpEngine* ]] || fail "could not read the public names from $headers"
alt=$(paste -sd'|' <<<"$names")
public="^((typeinfo name for |typeinfo for |vtable for )?ddp::($alt)(::|\(|\[|\$))"

# Exported = global or weak (nm's upper-case types, u, v, w, i). The linker sometimes keeps a LOCAL
# entry in .dynsym (Debian 1.13's build: a std::operator+ instance, type 't'); nothing can bind to it.
symbols=$(nm -DC --defined-only "$lib" | awk '$2 ~ /^([A-Z]|u|v|w|i)$/' | cut -d' ' -f3-)
[[ -n "$symbols" ]] || fail "nm found no exported symbols in $lib"
grep -q '^ddp::initProcessGroup(' <<<"$symbols" || fail "ddp::initProcessGroup is not exported by $lib"
stray=$(grep -Ev "$public" <<<"$symbols" || true)
if [[ -n "$stray" ]]; then
  echo "$stray" | head -40 >&2
  fail "$lib exports $(wc -l <<<"$stray") symbols outside include/ddp (libddp/libddp.map)"
fi
echo "ok: $(wc -l <<<"$symbols") exported symbols, all of include/ddp's $(wc -l <<<"$names") public names"
