#!/usr/bin/env bash
# The hang report, for real: hang_program.cc under ddp-launch (2 ranks) with rank 1 stopped by
# SIGSTOP, spinning in its own code, skipping one all-reduce, or all-reducing another size, on shm
# and Gloo. The launcher's report (log and hang_report.json, read by Python) must name rank 1, the
# collective it never entered or the one that does not pair, and a stack with the right function.
# With check_collectives the skip and the size stop at once with one line naming both calls.
# Usage: hang_test.sh DDP_LAUNCH HANG_PROGRAM PYTHON
set -uo pipefail
launch=$1 program=$2 python=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# run NAME SCENARIO BACKEND [check]: the job must fail (not time out here), with the log in NAME.log.
# Gloo fails a rank that receives another size than it expects (gloo::EnforceNotMet thrown on its
# own thread, where nothing catches it): one line and exit 1, no abort (CRASH_OK=1 allows a crash).
run() {
  local name=$1 scenario=$2 backend=$3 check=${4:-}
  mkdir -p "$work/$name"
  timeout 120 "$launch" --nproc_per_node=2 --shutdown_grace_s=2 "$program" "$scenario" "$backend" 3 \
    "$work/$name" $check >"$work/$name.log" 2>&1
  local rc=$?
  [[ $rc -ne 0 && $rc -ne 124 ]] || { cat "$work/$name.log"; fail "$name: exit code $rc, expected a failure"; }
  if [[ "${CRASH_OK:-0}" != 1 ]] && grep -qiE "segmentation|SIGSEGV|SIGABRT|core dumped|terminate called" "$work/$name.log"; then
    cat "$work/$name.log"; fail "$name: crashed"
  fi
}
expect() {  # expect NAME TEXT: the log has the text
  grep -qF -- "$2" "$work/$1.log" || { cat "$work/$1.log"; fail "$1: no line with '$2'"; }
}
# report NAME PYTHON_ASSERTIONS: hang_report.json, as `r`, passes them
report() {
  local file="$work/$1/hang_report.json"
  [[ -f "$file" ]] || { cat "$work/$1.log"; fail "$1: no $file"; return; }
  "$python" - "$file" "$2" <<'PY' || { cat "$work/$1.log"; cat "$file"; fail "$1: hang_report.json"; }
import json, sys
r = json.load(open(sys.argv[1]))
ranks = {x["rank"]: x for x in r["ranks"]}
def frames(rank):
    return [f for t in ranks[rank]["stack"]["threads"] for f in t["frames"]]
exec(sys.argv[2])
PY
}

for backend in shm gloo; do
  # Rank 1 stops itself (SIGSTOP) before all-reduce #4: rank 0 times out in it.
  name="stop_$backend"
  run "$name" stop "$backend"
  expect "$name" "hang report (a collective timed out"
  expect "$name" "rank 1 is behind: never entered all_reduce #4 (the loss) of 1000 float, which rank 0 entered"
  expect "$name" "stopped (state T)"
  expect "$name" "stopHereForHangTest"
  report "$name" '
assert r["reason"] == "timeout", r["reason"]
assert r["behind"] == [1] and r["ahead"] == [0], (r["behind"], r["ahead"])
assert r["missing"]["seq"] == 4 and r["missing"]["op"] == "all_reduce" and r["missing"]["numel"] == 1000
assert r["missing"]["label"] == "the loss", r["missing"]
assert ranks[0]["last_entered"]["state"] == "timed out" and ranks[0]["last_entered_seq"] == 4
assert ranks[1]["last_entered_seq"] == 3 and ranks[1]["last_finished_seq"] == 3
assert ranks[1]["stopped"] is True
assert any("stopHereForHangTest" in f for f in frames(1)), frames(1)
assert r["mismatch"] is None'

  # Rank 0, the store's host, stops itself: rank 1's census cannot reach the store, and the report
  # still comes within the timeout (3 s) + ~3 s of rank 1 entering #4 (issue 46 (15): 15 s with a
  # 5 s timeout, when the failing rank asked the stopped store once more, up to its timeout).
  name="stop0_$backend"
  run "$name" stop0 "$backend"
  expect "$name" "rank 0 is behind: never entered all_reduce #4 (the loss) of 1000 float, which rank 1 entered"
  report "$name" '
assert r["behind"] == [0] and r["missing"]["seq"] == 4, (r["behind"], r["missing"])
assert ranks[0]["stopped"] is True
assert r["missing"]["age_s"] < 3 + 5, r["missing"]["age_s"]'

  # Rank 1 spins in its own code instead of all-reduce #4.
  name="spin_$backend"
  run "$name" spin "$backend"
  expect "$name" "rank 1 is behind: never entered all_reduce #4 (the loss) of 1000 float"
  expect "$name" "spinInUserCodeForHangTest"
  report "$name" '
assert r["behind"] == [1] and r["missing"]["seq"] == 4
assert ranks[1]["stopped"] is False
assert "spinInUserCodeForHangTest" in frames(1)[0] or "spinInUserCodeForHangTest" in frames(1)[1], frames(1)[:3]'

  # Rank 1 skips the 3rd all-reduce: its barrier meets rank 0's 6th all-reduce at #6.
  name="skip_$backend"
  run "$name" skip "$backend"
  expect "$name" "collectives do not pair at #6 (different collectives): rank 0 all_reduce #6 (the loss) of 1000 float; rank 1 barrier #6"
  report "$name" '
m = r["mismatch"]
assert m["seq"] == 6 and m["kind"] == "different collectives", m
calls = {c["rank"]: c["op"] for c in m["calls"]}
assert calls == {0: "all_reduce", 1: "barrier"}, calls'

  # Rank 1 all-reduces 999 elements where rank 0 all-reduces 1000 (a different model on one rank).
  name="size_$backend"
  run "$name" size "$backend"
  if [[ $backend == gloo ]]; then
    expect "$name" "ddp: a Gloo transport thread failed ([enforce fail at"
    expect "$name" "the ranks' collectives do not pair (one rank sends another size than the other receives)"
  fi
  expect "$name" "collectives do not pair at #4 (different sizes): rank 0 all_reduce #4 (the loss) of 1000 float; rank 1 all_reduce #4 (the loss) of 999 float"
  if [[ $backend == shm ]]; then  # shm itself compares the ranks' calls: no silent 999-of-1000 sum
    expect "$name" "shm: the ranks' collectives do not pair: rank 1's collective is all_reduce of 999 float but rank 0's is all_reduce of 1000 float"
    expect "$name" "hang report (collectives do not pair"  # found at once: no timeout to name
  fi
  report "$name" '
m = r["mismatch"]
assert m["seq"] == 4 and m["kind"] == "different sizes", m
assert {c["rank"]: c["numel"] for c in m["calls"]} == {0: 1000, 1: 999}'

  # check_collectives: the same two bugs stop at the collective itself, with one line naming both calls.
  name="check_skip_$backend"
  run "$name" skip "$backend" check
  expect "$name" "caught ddp::Error: collectives do not pair (comm.check_collectives): collective #6 is barrier on rank 1 but all_reduce of 1000 float (the loss) on rank 0"
  name="check_size_$backend"
  run "$name" size "$backend" check
  expect "$name" "caught ddp::Error: collectives do not pair (comm.check_collectives): collective #4 is all_reduce of 999 float (the loss) on rank 1 but all_reduce of 1000 float (the loss) on rank 0"
done

# check_collectives on a clean job changes nothing.
for backend in shm gloo; do
  timeout 120 "$launch" --nproc_per_node=2 "$program" clean "$backend" 10 "$work" check >"$work/clean_$backend.log" 2>&1 \
    || { cat "$work/clean_$backend.log"; fail "clean_$backend: failed"; }
  expect "clean_$backend" "rank 1 finished"
done
[[ ! -f "$work/hang_report.json" ]] || fail "a clean job wrote a hang report"

# Issue 45 (5): rank 1 returns while rank 0 saves alone for 3 s, in no collective (its flight
# recorder says so) and using no CPU time: working, not waiting; the job ends 0, not stopped at the
# 1 s early-exit grace.
timeout 120 "$launch" --nproc_per_node=2 --early_exit_grace_s=1 "$program" late shm 10 "$work" >"$work/late.log" 2>&1 \
  || { cat "$work/late.log"; fail "late: a rank saving alone was stopped"; }
expect late "still work outside any collective"
expect late "rank 0 finished"

# Issue 45 (5), the other side: rank 1 returns 0 before all_reduce #4 while rank 0 waits in it (its
# flight recorder: in that collective for over a second). Past the 1 s grace the launcher stops the
# job naming the collective, long before the 60 s collective timeout.
start=$SECONDS
timeout 120 "$launch" --nproc_per_node=2 --early_exit_grace_s=1 "$program" quit gloo 60 "$work" >"$work/quit.log" 2>&1 \
  && { cat "$work/quit.log"; fail "quit: the job of a rank that left early ended 0"; }
expect quit "exited with code 0"
expect quit "while rank(s) 0 wait in a collective it never entered (all_reduce #4 (the loss)"
(( SECONDS - start < 30 )) || fail "quit: took $(( SECONDS - start )) s (the collective timeout is 60 s)"

# A rank stopped (SIGSTOP: Slurm's scontrol suspend, a paused VM) while it waits in a collective, for
# longer than the timeout (2 s), and continued: the stopped time is no peer's silence. Rank 0 waits in
# all_reduce #4 (blocked in futex, /proc/PID/syscall 202), is stopped for 3 s and continued; then rank 1
# comes (REPORT_DIR/go) and the job ends 0. On shm; Gloo's timeout is c10d's own, which counts the
# stopped time.
mkdir -p "$work/suspend"
timeout 120 "$launch" --nproc_per_node=2 "$program" suspend shm 2 "$work/suspend" >"$work/suspend.log" 2>&1 &
job=$!
pid=
for _ in $(seq 1000); do
  pid=$(sed -n 's/.*rank 0 pid \([0-9]*\) enters #4.*/\1/p' "$work/suspend.log")
  [[ -n "$pid" && "$(cut -d' ' -f1 /proc/$pid/syscall 2>/dev/null)" == 202 ]] && break
  sleep 0.01  # a polling interval
done
if [[ -z "$pid" ]]; then
  cat "$work/suspend.log"; fail "suspend: rank 0 never entered all_reduce #4"
else
  kill -STOP "$pid"
  sleep 3  # the suspension itself, longer than the 2 s timeout (not a synchronisation)
  kill -CONT "$pid"
fi
touch "$work/suspend/go"
wait $job || { cat "$work/suspend.log"; fail "suspend: a rank stopped past the timeout failed the job on resume"; }
expect suspend "rank 0 finished"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all hang-report checks passed"
