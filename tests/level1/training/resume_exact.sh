#!/usr/bin/env bash
# Exact resume: a 60-step run checkpointed at step 30, and a second run
# resumed from that checkpoint, give bitwise equal losses for steps 31-60
# (2 data-parallel processes).
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set training.max_steps=60 --set checkpoint.interval=30 \
  --set run.output_dir="$WORK/full" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "uninterrupted run failed"; }
[[ -d "$WORK/full/checkpoints/step_00000030" ]] || fail "no step-30 checkpoint"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set training.max_steps=60 \
  --set checkpoint.resume="$WORK/full/checkpoints/step_00000030" \
  --set run.output_dir="$WORK/resumed" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "resumed run failed"; }
grep -q "resumed from .* at step 30" "$WORK/log" || fail "did not resume at 30"
"$BIN/hp-compare" "$WORK/full" "$WORK/resumed" --from-step 31 --exact --phase resume || fail "resume is not exact"
echo PASS
