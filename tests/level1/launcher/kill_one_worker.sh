#!/usr/bin/env bash
# A worker killed by SIGKILL ends the whole job within 10 s, and the summary names it. The
# trailing echo keeps bash from exec-ing sleep, so each worker has a child that must die too.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start_launcher --nproc-per-node 4 -- \
  bash -c 'echo $$ > $WORK/pid.$RANK; echo hello from $RANK; sleep 60; echo not reached'
wait_for_files 10 "$WORK"/pid.{0,1,2,3}
for r in 0 1 2 3; do pid[r]=$(<"$WORK/pid.$r"); done

start=$(now)
kill -KILL "${pid[2]}"
wait_launcher 15 "$start"
echo "hp-launch exited $RC, ${ELAPSED} s after rank 2 was killed"

[[ $RC != 0 ]] || fail "hp-launch exited 0 although rank 2 was killed"
expect_rc 137
less_than "$ELAPSED" 10 || fail "the job took $ELAPSED s to end, more than 10 s"
expect_text err "hp-launch: rank 2 (pid ${pid[2]}) failed: killed by signal 9 (SIGKILL)"
expect_line err "[rank 2] hello from 2"
expect_text err "rank 0 terminated by hp-launch"
expect_text err "rank 3 terminated by hp-launch"
for r in 0 1 2 3; do expect_line out "[rank $r] hello from $r"; done
expect_gone "${pid[0]}" "${pid[1]}" "${pid[3]}" "${pid[2]}"
echo PASS
