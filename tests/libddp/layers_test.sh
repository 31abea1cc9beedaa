#!/usr/bin/env bash
# The layers of ARCHITECTURE.md, checked on the sources (and the launcher's binary):
#   include/ddp/   public headers: LibTorch, the standard library and <ddp/...> only
#   libddp/        the library: may include include/ddp, comm/, sampler/, common/; never worker/
#   libddp/engine/ DDP's own logic (Reducer, buckets, gradient sync): on the public ProcessGroup only,
#                  never comm/ nor libddp/internal.h
#   comm/ sampler/ below the library: never libddp/ or worker/; of include/ddp only the shared types
#                  (ddp/collectives.h, ddp/error.h)
#   common/        below everything: never comm/, sampler/, libddp/, worker/, nor LibTorch; of include/ddp
#                  only ddp/error.h, the error family every layer throws (itself the standard library only)
#   launcher/      ddp-launch: common/ only, no LibTorch header (nor in the common/ files it includes),
#                  and its binary does not link LibTorch
#   worker/        one way down: config/report <- models <- data <- train <- dp <- main.cc; the
#                  library as a user has it: include/ddp and common/, never libddp/ or comm/ (and its
#                  program links libddp.so, not the static twin)
# Usage: layers_test.sh SOURCE_DIR [DDP_LAUNCH_BINARY [WORKER_BINARY]]
set -euo pipefail
src=$1 launcher_bin=${2:-} worker_bin=${3:-}
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
forbid '^(libddp|comm|sampler)/' "the worker uses the library as a user does: include/ddp (make what it needs public, with a test)" worker
forbid '^(comm/|libddp/internal\.h$)' "DDP's logic is written against the public ddp::ProcessGroup, as a user's code is" libddp/engine
forbid '^comm/process_group\.h$' "the CUDA plugin's interface takes the group's options (comm/group_options.h), not the factory above it" \
  comm/cuda_plugin.h
# A namespace per layer: the application's code is ddp::worker (ddp::worker::data, ...), never one of the
# library's (ddp, ddp::data, ...).
for file in $(sources_in worker); do
  while IFS= read -r line; do
    violations+=("$file: \"$line\": the worker's namespaces are ddp::worker and those inside it")
  done < <(grep -E '^namespace ddp\b' "$file" | grep -vE '^namespace ddp::worker(::[A-Za-z_:]+)?[[:space:]]*\{' || true)
done
# The backends share the front's types only (c10d's Types.hpp), not its classes.
for file in $(sources_in comm sampler); do
  while IFS= read -r inc; do
    if [[ $inc == ddp/* && $inc != ddp/collectives.h && $inc != ddp/error.h ]]; then
      violations+=("$file includes \"$inc\": comm/ and sampler/ take ddp/collectives.h and ddp/error.h from include/ddp, nothing else")
    fi
  done < <(includes_of "$file")
done

# common/ is below the library: the standard library and the system only, and of include/ddp only the
# error family, which must itself stay a leaf.
torch_re='^(torch|ATen|c10|caffe2)/'
for file in $(sources_in common); do
  while IFS= read -r inc; do
    [[ -n $inc && $inc =~ $torch_re ]] && violations+=("$file includes <$inc>: common/ is below LibTorch")
  done < <(system_includes_of "$file")
  while IFS= read -r inc; do
    if [[ $inc == ddp/* && $inc != ddp/error.h ]]; then
      violations+=("$file includes \"$inc\": common/ takes only ddp/error.h from include/ddp")
    fi
  done < <(includes_of "$file")
done
while IFS= read -r inc; do
  [[ -n $inc ]] && violations+=("include/ddp/error.h includes \"$inc\": the error family is a leaf (common/ includes it)")
done < <(includes_of include/ddp/error.h)
while IFS= read -r inc; do
  [[ -n $inc && $inc != stdexcept && $inc != string ]] && violations+=("include/ddp/error.h includes <$inc>: the error family is a leaf (the standard library's <stdexcept> and <string>)")
done < <(system_includes_of include/ddp/error.h)

# No LibTorch in the launcher, nor in the common/ headers and sources it uses.
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
# The worker program links libddp.so as a user's program does (its tests may take the static twin).
if [[ -n $worker_bin ]]; then
  [[ -x $worker_bin ]] || { echo "FAIL: $worker_bin is not an executable" >&2; exit 1; }
  worker_libs=$(ldd "$worker_bin" 2>&1 || true)
  [[ $worker_libs == *libddp.so* ]] || violations+=("$worker_bin does not link libddp.so (it must use the library as users do)")
  if nm -C "$worker_bin" 2>/dev/null | grep -qE ' [Tt] ddp::((checkpoint|comm|runtime|engine|internal)::|initProcessGroup\()'; then
    violations+=("$worker_bin holds the library's code itself (the static twin): link it to libddp.so")
  fi
fi
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
