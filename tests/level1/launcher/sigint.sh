#!/usr/bin/env bash
# SIGINT or SIGTERM to hp-launch stops every worker and exits 128 + signal within 10 s.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

interrupt() {
  local sig=$1 rc=$2
  rm -f "$WORK"/pid.*
  start_launcher --nproc-per-node 2 -- bash -c 'echo $$ > $WORK/pid.$RANK; sleep 60; echo not reached'
  wait_for_files 10 "$WORK"/pid.{0,1}
  local pid0 pid1 start
  pid0=$(<"$WORK/pid.0")
  pid1=$(<"$WORK/pid.1")
  start=$(now)
  kill -"$sig" "$LAUNCHER_PID"
  wait_launcher 15 "$start"
  echo "SIG$sig: hp-launch exited $RC after $ELAPSED s"
  expect_rc "$rc"
  less_than "$ELAPSED" 10 || fail "the job took $ELAPSED s to end after SIG$sig"
  expect_text err "hp-launch: interrupted by SIG$sig"
  expect_text err "rank 0 terminated by hp-launch (SIGTERM)"
  expect_gone "$pid0" "$pid1"
}

interrupt INT 130
interrupt TERM 143
echo PASS
