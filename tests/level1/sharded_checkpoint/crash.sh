#!/usr/bin/env bash
# A worker SIGKILLed at a random point while background saves (every 2
# steps) are being written, ten times in a chain: each round resumes from
# the `latest` the previous kill left (checked in its log) and is killed in
# turn, every round while its workers still train (the launcher reports the
# SIGKILL); `latest` must load every time. A last run resumes from the last
# `latest` and finishes, and from there on it is bitwise equal to one
# uninterrupted run of the same config, layout and checkpoint cadence.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
# Far enough that no round reaches the end before its kill (a round trains
# at most 4 commits of 2 steps past its resume, whatever the machine's
# speed), the same for every run so the schedule is the same.
MAX=120
args=(--set checkpoint.interval=2 --set features.sharded_checkpoint.enabled=true
      --set features.sharded_checkpoint.async=true --set training.max_steps=$MAX)
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${args[@]}" --set run.output_dir="$WORK/ref" > "$WORK/ref.log" 2>&1 \
  || { tail -20 "$WORK/ref.log"; fail "the uninterrupted run"; }
at=""
for i in $(seq 1 10); do
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${args[@]}" --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 &
  launcher=$!
  # Training has (re)started once this round has committed a step of its
  # own; then 0-2 more commits and a random moment (saves are every 2 steps,
  # written in the background, so the kill lands in a write or between).
  seen=$at
  for _ in $(seq 0 $(( RANDOM % 3 ))); do
    for _ in $(seq 1 1000); do
      [[ -f "$WORK/run/checkpoints/latest" && "$(cat "$WORK/run/checkpoints/latest")" != "$seen" ]] && break
      sleep 0.01
    done
    seen=$(cat "$WORK/run/checkpoints/latest" 2>/dev/null)
  done
  sleep "0.0$(( RANDOM % 10 ))"
  victim=$(pgrep -P "$launcher" | shuf -n 1 || true)  # the launcher's children are the workers
  [[ -n "$victim" ]] || { tail -20 "$WORK/log"; fail "round $i: no worker to kill (the run ended?)"; }
  kill -9 "$victim" 2>/dev/null
  wait "$launcher" && fail "round $i: the run succeeded although a worker was killed"
  grep -q "killed by signal 9" "$WORK/log" || { tail -20 "$WORK/log"; fail "round $i: no worker died of the SIGKILL"; }
  if [[ -n "$at" ]]; then
    grep -q "resumed from .*$at" "$WORK/log" || { tail -20 "$WORK/log"; fail "round $i: did not resume from $at"; }
  fi
  [[ -f "$WORK/run/checkpoints/latest" ]] || { tail -5 "$WORK/log"; fail "round $i: no latest"; }
  at=$(cat "$WORK/run/checkpoints/latest")
  echo "round $i: killed worker $victim; latest is $at"
done
step=$(( 10#${at#step_} ))
(( step < MAX )) || fail "the chain reached step $MAX; raise MAX"
# The last run reads the chain's checkpoints and logs into a fresh directory.
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${args[@]}" --set checkpoint.dir="$WORK/run/checkpoints" \
  --set run.output_dir="$WORK/last" > "$WORK/log" 2>&1 || { tail -20 "$WORK/log"; fail "the last resume from $at failed"; }
grep -q "resumed from .*$at at step $step" "$WORK/log" || fail "the last run did not resume from $at"
"$BIN/hp-compare" "$WORK/ref" "$WORK/last" --exact --from-step $(( step + 1 )) --phase "resume after the kill chain" \
  > "$WORK/cmp" || { tail -5 "$WORK/cmp"; fail "the resumed run is not bitwise the uninterrupted one"; }
grep -q "^compared $(( MAX - step )) steps" "$WORK/cmp" || { tail -3 "$WORK/cmp"; fail "not every step after $step compared"; }
tail -1 "$WORK/cmp"
echo PASS
