#!/usr/bin/env bash
# A worker SIGKILLed at a random point while background saves are being
# written, ten times: each time `latest` loads and the run resumes from it
# and trains on.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
args=(--set checkpoint.interval=2 --set features.sharded_checkpoint.enabled=true
      --set features.sharded_checkpoint.async=true --set run.output_dir="$WORK/run")
for i in $(seq 1 10); do
  rm -rf "$WORK/run"
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${args[@]}" --set training.max_steps=60 > "$WORK/log" 2>&1 &
  launcher=$!
  # Wait for the first commit, then kill one worker at a random moment.
  for _ in $(seq 1 300); do [[ -f "$WORK/run/checkpoints/latest" ]] && break; sleep 0.02; done
  sleep "0.$(( RANDOM % 6 ))$(( RANDOM % 10 ))"
  victim=$(pgrep -P "$launcher" | shuf -n 1 || true)  # the launcher's children are the workers
  [[ -n "$victim" ]] && kill -9 "$victim" 2>/dev/null
  wait "$launcher" || true
  [[ -f "$WORK/run/checkpoints/latest" ]] || { tail -5 "$WORK/log"; fail "round $i: no latest"; }
  at=$(cat "$WORK/run/checkpoints/latest")
  # Two steps past it are enough to show the loaded state trains.
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${args[@]}" --set training.max_steps=$(( 10#${at#step_} + 2 )) \
    > "$WORK/log" 2>&1 \
    || { tail -20 "$WORK/log"; fail "round $i: resume from $at failed"; }
  grep -q "resumed from" "$WORK/log" || fail "round $i: did not resume from $at"
  echo "round $i: killed ${victim:-nothing (run had ended)}, latest was $at, resumed and finished"
done
echo PASS
