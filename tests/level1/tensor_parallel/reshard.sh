#!/usr/bin/env bash
# A checkpoint written at tp=2 loads at tp=1 and at tp=4 and continues with
# the same losses as the uninterrupted tp=2 run (within 1e-4); at tp=2
# again, bitwise.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
tp() { echo --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size="$1"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(tp 2) --set training.max_steps=40 --set checkpoint.interval=20 \
  --set run.output_dir="$WORK/tp2" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "tp=2 run"; }
ck="$WORK/tp2/checkpoints/step_00000020"
[[ -d "$ck" ]] || fail "no step-20 checkpoint"
"$BIN/hp-train" "$WORK/c.yaml" --set training.max_steps=40 --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/tp1" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "tp=1 resume"; }
grep -q "resumed from .* at step 20" "$WORK/log" || fail "tp=1 did not resume"
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 4 $(tp 4) --set training.max_steps=40 --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/tp4" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "tp=4 resume"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(tp 2) --set training.max_steps=40 --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/tp2again" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "tp=2 resume"; }
resumed_bitwise tp2 tp2again 21
resumed_within tp2 21 tp1 tp4
echo PASS
