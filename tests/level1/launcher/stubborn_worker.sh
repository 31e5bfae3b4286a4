#!/usr/bin/env bash
# A worker that ignores SIGTERM is SIGKILLed after the 5 s grace, and the job still ends in 10 s.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start_launcher --nproc-per-node 2 -- bash -c '
  if [[ $RANK == 1 ]]; then
    while [[ ! -e $WORK/ready ]]; do sleep 0.05; done
    echo giving up; exit 1
  fi
  trap "" TERM; echo $$ > $WORK/pid.0; touch $WORK/ready; sleep 60'
wait_for_files 10 "$WORK/pid.0"
start=$(now)
wait_launcher 15 "$start"
echo "hp-launch exited $RC after $ELAPSED s"

expect_rc 1
less_than 4.5 "$ELAPSED" || fail "rank 0 was killed after $ELAPSED s, before the 5 s grace"
less_than "$ELAPSED" 10 || fail "the job took $ELAPSED s to end, more than 10 s"
grep -qE '^hp-launch: rank 1 \(pid [0-9]+\) failed: exit code 1$' "$WORK/err" ||
  fail "the summary does not name rank 1"
expect_text err "other ranks: rank 0 terminated by hp-launch (SIGKILL)"
expect_gone "$(<"$WORK/pid.0")"
echo PASS
