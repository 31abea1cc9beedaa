#!/usr/bin/env bash
# A library user's mistakes, each run for real (misuse_program.cc under ddp-launch, 2 ranks): every
# one must end with one line naming the mistake and a non-zero exit, never a segfault, and no rank
# may report success while another is left in a collective.
# Usage: misuse_test.sh DDP_LAUNCH MISUSE_PROGRAM
set -uo pipefail
launch=$1 program=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# run NAME EXPECTED_RC COMMAND...: output in $work/NAME.log, checks the exit code
run() {
  local name=$1 expected=$2
  shift 2
  timeout 120 "$@" >"$work/$name.log" 2>&1
  local rc=$?
  if [[ "$expected" == nonzero ]]; then
    [[ $rc -ne 0 && $rc -ne 124 ]] || { cat "$work/$name.log"; fail "$name: exit code $rc, expected a failure (not a timeout)"; }
  else
    [[ $rc -eq $expected ]] || { cat "$work/$name.log"; fail "$name: exit code $rc, expected $expected"; }
  fi
  if grep -qiE "segmentation|SIGSEGV|SIGABRT|core dumped|terminate called" "$work/$name.log"; then
    cat "$work/$name.log"; fail "$name: crashed"
  fi
}
expect() {  # expect NAME TEXT: the log has the text
  grep -qF -- "$2" "$work/$1.log" || { cat "$work/$1.log"; fail "$1: no line with '$2'"; }
}
expect_not() {
  if grep -qF -- "$2" "$work/$1.log"; then cat "$work/$1.log"; fail "$1: unexpected '$2'"; fi
}

# A null group handle is refused where it is made.
run null_group 3 "$program" null_group
expect null_group "caught ddp::ConfigError: ddp::ProcessGroup: no group (a null handle); get one from ddp::initProcessGroup()"

# A LibTorch loader over three passes without setEpoch: one warning, not three, and no error.
run forget_set_epoch 0 "$program" forget_set_epoch
expect forget_set_epoch "three passes done"
count=$(grep -c "call sampler.setEpoch(epoch) before each epoch" "$work/forget_set_epoch.log")
[[ "$count" == 1 ]] || { cat "$work/forget_set_epoch.log"; fail "forget_set_epoch: $count warnings, expected 1"; }

# The pairing itself: a clean shutdown passes on both CPU backends.
for backend in shm gloo; do
  run "clean_$backend" 0 "$launch" --nproc_per_node=2 "$program" clean "$backend" 10
  expect "clean_$backend" "rank 0 finished clean"
  expect "clean_$backend" "rank 1 finished clean"
done

# Rank 0 (the store's host) fails its beforeGroup check alone: rank 1 stops with rank 0's line and
# class, not with a lost connection to the store.
for backend in shm gloo; do
  name="before_group_fails_on_rank0_$backend"
  run "$name" 3 "$launch" --nproc_per_node=2 "$program" before_group_fails_on_rank0 "$backend" 10
  expect "$name" "caught ddp::ConfigError: the model does not fit (a check of rank 0's own) (rank 0's error; this rank stops with it)"
  expect_not "$name" "made its group"
  expect_not "$name" "connection"
done

# A recv that no rank answers ends at the group's timeout (3 s here) with one line, on Gloo (both
# ranks wait for the other: whichever times out first reports).
run recv_nobody_sends nonzero "$launch" --nproc_per_node=2 "$program" recv_nobody_sends gloo 3
expect recv_nobody_sends "caught ddp::CommError: gloo recv on rank "
expect recv_nobody_sends "/2 timed out (["
expect_not recv_nobody_sends "finished recv_nobody_sends"

# A handle used after it was moved from, a step or a backward after destroy().
run generators_of_one_process_in_two nonzero "$launch" --nproc_per_node=2 "$program" generators_of_one_process_in_two shm 10
expect generators_of_one_process_in_two "caught ddp::ConfigError: ddp::CheckpointOptions::cudaGenerators is for a one-process job"
expect_not generators_of_one_process_in_two "finished generators_of_one_process_in_two"

# newGroup with another list of ranks on one rank: one line at once (it waited out the group's
# timeout, 60 s here, then blamed the shared-memory segment).
run new_group_of_other_ranks nonzero "$launch" --nproc_per_node=2 "$program" new_group_of_other_ranks shm 60
expect new_group_of_other_ranks "caught ddp::ConfigError: ddp::ProcessGroup::newGroup (call 1): rank "
expect new_group_of_other_ranks "every rank must call newGroup with the same ranks"
expect_not new_group_of_other_ranks "timed out"

run moved_group nonzero "$launch" --nproc_per_node=2 "$program" moved_group shm 10
expect moved_group "caught ddp::ConfigError: ddp::ProcessGroup: this handle was moved from"
for scenario in forward_after_destroy backward_after_destroy; do
  run "$scenario" nonzero "$launch" --nproc_per_node=2 "$program" "$scenario" shm 10
  expect "$scenario" "after the group was destroyed (ProcessGroup::destroy() at "
  expect "$scenario" "misuse_program.cc:"
  expect_not "$scenario" "finished $scenario"
done
expect forward_after_destroy "ddp::ProcessGroup: a forward through the DDP wrapper on rank "
expect backward_after_destroy "ddp::ProcessGroup: all_reduce on rank "

# Collectives that do not pair: rank 0 saves, steps or evaluates through the DDP wrapper alone while
# rank 1 calls destroy(). shm: at once; Gloo: at the collectives' timeout (5 s here).
for backend in shm gloo; do
  for scenario in save_on_rank0_only extra_step_on_rank0 eval_on_rank0_only; do
    name="${scenario}_$backend"
    run "$name" nonzero "$launch" --nproc_per_node=2 "$program" "$scenario" "$backend" 5
    if [[ $backend == shm ]]; then
      # shm compares the ranks' calls in the collective itself: both ranks stop at once, rank 0 with
      # what the store knows of rank 1's destroy().
      expect "$name" "caught ddp::CommError: ddp::ProcessGroup::destroy() at "
      expect "$name" "shm: the ranks' collectives do not pair: rank 1's collective is barrier but rank 0's is "
      expect "$name" "; rank 1 had called destroy() after its collective all_reduce #5 (DDP gradients) while this rank was in "
    else
      expect "$name" "caught ddp::CommError: ddp::ProcessGroup::destroy() at "
      expect "$name" "ranks called different collectives: rank 1 called destroy() after its collective all_reduce #5 (DDP gradients); rank 0 had not called destroy()"
    fi
    expect_not "$name" "rank 1 finished"
    expect_not "$name" "rank 0 finished"
  done
done

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS"
