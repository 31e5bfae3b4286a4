#!/usr/bin/env bash
# Recompute on vs off: bitwise equal losses for 20 steps and equal first-step
# gradients, for both granularities. Dropout is on (small_config), so the
# recomputed forward must replay the same masks; every step of each run must
# have replayed regions (recompute_regions_replayed > 0).
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --set training.dump_grads_at_step=1 --set run.output_dir="$WORK/off" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "off"; }
for g in full selective; do
  "$BIN/hp-train" "$WORK/c.yaml" --set training.dump_grads_at_step=1 --set run.output_dir="$WORK/$g" \
    --set features.recompute.enabled=true --set features.recompute.granularity=$g > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$g"; }
  replayed_every_step "$WORK/$g" || fail "recompute $g did not run"
  echo "== recompute $g against off"
  "$BIN/hp-compare" "$WORK/off" "$WORK/$g" --exact --grads-step 1 --grad-rtol 0 --phase recompute || fail "recompute $g differs"
done
echo PASS
