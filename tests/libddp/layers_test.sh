#!/usr/bin/env bash
# The layers of ARCHITECTURE.md, checked on the sources (and the launcher's binary):
#   include/ddp/   public headers: LibTorch, the standard library and <ddp/...> only
#   libddp/        the library: may include include/ddp, comm/, sampler/, common/; never worker/
#   libddp/engine/ DDP's own logic (Reducer, buckets, gradient sync): on the public ProcessGroup only,
#                  never comm/ nor libddp/internal.h
#   comm/ sampler/ below the library: never libddp/ or worker/; of include/ddp only the shared types
#                  (ddp/collectives.h, ddp/error.h)
#   common/        below everything: never comm/, sampler/, libddp/, worker/
#   launcher/      ddp-launch: common/ only, no LibTorch header (nor in the common/ files it includes),
#                  and its binary does not link LibTorch
#   worker/        one way down: config/report <- models <- data <- train <- dp <- main.cc; the
#                  public classes through include/ddp, never libddp/internal.h
# Usage: layers_test.sh SOURCE_DIR [DDP_LAUNCH_BINARY]
set -euo pipefail
src=$1 launcher_bin=${2:-}
cd "$src"
violations=()

# Quoted project includes of one file, one per line ("comm/reducer.h").
includes_of() { sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$1"; }
# Angle-bracket includes of one file.
system_includes_of() { sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+<([^>]+)>.*/\1/p' "$1"; }
sources_in() { find "$@" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.h.in' \) | sort; }

# forbid FILES_ROOT... -- PATTERN REASON: no quoted include of FILES may match PATTERN.
forbid() {
  local pattern=$1 reason=$2; shift 2
  local file inc
  for file in $(sources_in "$@"); do
    while IFS= read -r inc; do
      [[ -z $inc ]] && continue
      if [[ $inc =~ $pattern ]]; then violations+=("$file includes \"$inc\": $reason"); fi
    done < <(includes_of "$file")
  done
}

forbid '^worker/' "the library never includes the application (move what it needs into libddp/)" \
  include libddp comm sampler common
forbid '^(libddp|comm|sampler|common|api)/' "public headers use LibTorch, the standard library and <ddp/...> only" include/ddp
forbid '^libddp/' "comm/ and sampler/ are below the library" comm sampler
forbid '^(libddp|comm|sampler)/' "common/ is below everything" common
forbid '^(libddp|comm|sampler|worker|include)/' "the launcher builds on common/ only" launcher
forbid '^libddp/internal\.h$' "the worker uses the public classes (include/ddp), not their insides" worker
forbid '^(comm/|libddp/internal\.h$)' "DDP's logic is written against the public ddp::ProcessGroup, as a user's code is" libddp/engine
# The backends share the front's types only (c10d's Types.hpp), not its classes.
for file in $(sources_in comm sampler); do
  while IFS= read -r inc; do
    if [[ $inc == ddp/* && $inc != ddp/collectives.h && $inc != ddp/error.h ]]; then
      violations+=("$file includes \"$inc\": comm/ and sampler/ take ddp/collectives.h and ddp/error.h from include/ddp, nothing else")
    fi
  done < <(includes_of "$file")
done

# No LibTorch in the launcher, nor in the common/ headers and sources it uses.
torch_re='^(torch|ATen|c10|caffe2)/'
launcher_files=$(sources_in launcher)
for inc in $(cat $launcher_files | grep -ohE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"common/[^"]+"' \
             | sed -E 's/.*"(.*)"/\1/' | sort -u); do
  launcher_files+=$'\n'"$inc"
  [[ -f ${inc%.h}.cc ]] && launcher_files+=$'\n'"${inc%.h}.cc"
done
for file in $launcher_files; do
  while IFS= read -r inc; do
    [[ -n $inc && $inc =~ $torch_re ]] && violations+=("$file includes <$inc>: no LibTorch in the launcher")
  done < <(system_includes_of "$file")
done
if [[ -n $launcher_bin ]]; then
  [[ -x $launcher_bin ]] || { echo "FAIL: $launcher_bin is not an executable" >&2; exit 1; }
  libs=$(ldd "$launcher_bin" 2>&1 || true)
  if [[ $libs == *libtorch* || $libs == *libc10* ]]; then violations+=("$launcher_bin links LibTorch"); fi
fi

# Inside the worker: a folder includes only folders below it (or itself).
rank_of() {
  case $1 in
    config|report) echo 0 ;; models) echo 1 ;; data) echo 2 ;; train) echo 3 ;; dp) echo 4 ;;
    main.cc|main) echo 5 ;; *) echo -1 ;;
  esac
}
for file in $(sources_in worker); do
  rel=${file#worker/}
  folder=${rel%%/*}
  from=$(rank_of "$folder")
  if [[ $from -lt 0 ]]; then violations+=("$file is in no known worker folder (config report models data train dp)"); continue; fi
  while IFS= read -r inc; do
    [[ $inc == worker/* ]] || continue
    target=${inc#worker/}; target=${target%%/*}
    [[ $target == "$folder" ]] && continue
    to=$(rank_of "$target")
    if [[ $to -lt 0 || $to -ge $from ]]; then
      violations+=("$file includes \"$inc\": worker/$folder may include only folders below it (config/report <- models <- data <- train <- dp <- main.cc)")
    fi
  done < <(includes_of "$file")
done

checked=$(sources_in include libddp comm sampler common launcher worker | wc -l)
if [[ ${#violations[@]} -gt 0 ]]; then
  printf 'FAIL: %s\n' "${violations[@]}" >&2
  echo "FAIL: ${#violations[@]} include(s) break the layers (ARCHITECTURE.md) in $checked files" >&2
  exit 1
fi
[[ $checked -gt 100 ]] || { echo "FAIL: only $checked files found under $src; wrong SOURCE_DIR?" >&2; exit 1; }
echo "ok: $checked files keep the layers"
