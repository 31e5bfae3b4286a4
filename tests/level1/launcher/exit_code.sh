#!/usr/bin/env bash
# A worker exiting 3 makes hp-launch exit 3 within 10 s, with that rank's last lines.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start=$(now)
start_launcher --nproc-per-node 2 --tail-lines 2 -- bash -c '
  if [[ $RANK == 1 ]]; then
    echo line one; echo line two; echo last words; exit 3
  fi
  echo $$ > $WORK/pid.$RANK; sleep 60'
wait_launcher 15 "$start"
echo "hp-launch exited $RC after $ELAPSED s"

expect_rc 3
less_than "$ELAPSED" 10 || fail "the job took $ELAPSED s to end, more than 10 s"
expect_text err ") failed: exit code 3"
grep -qE '^hp-launch: rank 1 \(pid [0-9]+\) failed: exit code 3$' "$WORK/err" ||
  fail "the summary does not name rank 1"
expect_line err "hp-launch: last 2 lines of rank 1:"
expect_line err "[rank 1] line two"
expect_line err "[rank 1] last words"
[[ $(grep -cxF "[rank 1] line one" "$WORK/err" || true) == 0 ]] ||
  fail "--tail-lines 2 repeated more than 2 lines"
expect_line out "[rank 1] line one"
expect_text err "other ranks: rank 0 "
if [[ -s $WORK/pid.0 ]]; then expect_gone "$(<"$WORK/pid.0")"; fi

# Rank 0 finishes before silent rank 2 fails; rank 1 is stopped.
rm -f "$WORK"/pid.*
run_launcher --nproc-per-node 3 -- bash -c '
  case $RANK in
    0) echo $$ > $WORK/pid.0; exit 0 ;;
    1) sleep 60; echo not reached ;;
    2) while [[ ! -s $WORK/pid.0 ]]; do sleep 0.02; done
       while kill -0 $(<$WORK/pid.0) 2>/dev/null; do sleep 0.02; done  # until reaped
       exit 5 ;;
  esac'
expect_rc 5
grep -qE '^hp-launch: rank 2 \(pid [0-9]+\) failed: exit code 5$' "$WORK/err" ||
  fail "the summary does not name rank 2"
expect_line err "hp-launch: rank 2 printed nothing"
expect_line err \
  "hp-launch: other ranks: rank 0 finished (exit code 0), rank 1 terminated by hp-launch (SIGTERM)"
echo PASS
