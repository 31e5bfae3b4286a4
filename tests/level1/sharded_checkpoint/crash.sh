#!/usr/bin/env bash
# A worker SIGKILLed at a random point while background saves (every 2
# steps) are being written, ten times in a chain: each round resumes from
# the `latest` the previous kill left (checked in its log) and is killed in
# turn; a last run resumes and finishes. `latest` must load every time.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
args=(--set checkpoint.interval=2 --set features.sharded_checkpoint.enabled=true
      --set features.sharded_checkpoint.async=true --set run.output_dir="$WORK/run")
at=""
for i in $(seq 1 10); do
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${args[@]}" --set training.max_steps=100000 > "$WORK/log" 2>&1 &
  launcher=$!
  # Training has (re)started once this round has committed a step of its own.
  for _ in $(seq 1 500); do
    [[ -f "$WORK/run/checkpoints/latest" && "$(cat "$WORK/run/checkpoints/latest")" != "$at" ]] && break
    sleep 0.02
  done
  sleep "0.$(( RANDOM % 5 ))$(( RANDOM % 10 ))"
  victim=$(pgrep -P "$launcher" | shuf -n 1 || true)  # the launcher's children are the workers
  [[ -n "$victim" ]] || { tail -20 "$WORK/log"; fail "round $i: no worker to kill (the run ended?)"; }
  kill -9 "$victim" 2>/dev/null
  wait "$launcher" && fail "round $i: the run succeeded although a worker was killed"
  if [[ -n "$at" ]]; then
    grep -q "resumed from .*$at" "$WORK/log" || { tail -20 "$WORK/log"; fail "round $i: did not resume from $at"; }
  fi
  [[ -f "$WORK/run/checkpoints/latest" ]] || { tail -5 "$WORK/log"; fail "round $i: no latest"; }
  at=$(cat "$WORK/run/checkpoints/latest")
  echo "round $i: killed worker $victim; latest is $at"
done
# Two steps past it are enough to show the loaded state trains.
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${args[@]}" --set training.max_steps=$(( 10#${at#step_} + 2 )) \
  > "$WORK/log" 2>&1 || { tail -20 "$WORK/log"; fail "the last resume from $at failed"; }
grep -q "resumed from .*$at" "$WORK/log" || fail "the last run did not resume from $at"
echo PASS
