#!/usr/bin/env bash
# Exact resume: a 20-step run checkpointed at step 10, and a second run
# resumed from that checkpoint, give bitwise equal losses for steps 11-20
# (2 data-parallel processes).
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set training.max_steps=20 --set checkpoint.interval=10 \
  --set run.output_dir="$WORK/full" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "uninterrupted run failed"; }
[[ -d "$WORK/full/checkpoints/step_00000010" ]] || fail "no step-10 checkpoint"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set training.max_steps=20 \
  --set checkpoint.resume="$WORK/full/checkpoints/step_00000010" \
  --set run.output_dir="$WORK/resumed" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "resumed run failed"; }
grep -q "resumed from .* at step 10" "$WORK/log" || fail "did not resume at 10"
"$BIN/hp-compare" "$WORK/full" "$WORK/resumed" --from-step 11 --exact --phase resume || fail "resume is not exact"
echo PASS
