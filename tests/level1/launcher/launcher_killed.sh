#!/usr/bin/env bash
# If hp-launch itself is SIGKILLed its workers die with it (PR_SET_PDEATHSIG). Only direct
# children can be reached that way, hence the exec.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start_launcher --nproc-per-node 2 -- bash -c 'echo $$ > $WORK/pid.$RANK; exec sleep 60'
wait_for_files 10 "$WORK"/pid.{0,1}
kill -KILL "$LAUNCHER_PID"
wait "$LAUNCHER_PID" 2>/dev/null || true
LAUNCHER_PID=
start=$(now)
for r in 0 1; do
  pid=$(<"$WORK/pid.$r")
  while kill -0 "$pid" 2>/dev/null && [[ $(proc_state "$pid") != Z ]]; do
    less_than "$(seconds_since "$start")" 2 || fail "rank $r (pid $pid) outlived hp-launch by 2 s"
    sleep 0.02
  done
done
echo PASS
