#!/usr/bin/env bash
# A checkpoint written at pp=2 (each stage writes its own blocks) loads at
# pp=1 and at pp=4 and continues with the same losses as the uninterrupted
# pp=2 run (within 1e-6, the pipeline parity bar); at pp=2 again, bitwise,
# also with dropout, and with dropout resumed under schedules zb_h1 and zbv.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
pp() { echo --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size="$1"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(pp 2) --set training.max_steps=40 --set checkpoint.interval=20 \
  --set run.output_dir="$WORK/pp2" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "pp=2 run"; }
ck="$WORK/pp2/checkpoints/step_00000020"
[[ -d "$ck" ]] || fail "no step-20 checkpoint"
ls "$ck"
"$BIN/hp-train" "$WORK/c.yaml" --set training.max_steps=40 --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/pp1" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "pp=1 resume"; }
grep -q "resumed from .* at step 20" "$WORK/log" || fail "pp=1 did not resume"
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 4 $(pp 4) --set training.max_steps=40 --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/pp4" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "pp=4 resume"; }
grep -q "resumed from .* at step 20" "$WORK/log" || fail "pp=4 did not resume"
# Same layout: docs/PARITY.md's resume bar, bitwise.
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(pp 2) --set training.max_steps=40 --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/pp2again" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "pp=2 resume"; }
echo "== pp2 resumed from its own checkpoint"
"$BIN/hp-compare" "$WORK/pp2" "$WORK/pp2again" --from-step 21 --exact --phase resume | tail -2 || fail "pp2 resume not bitwise"
# A second pp=2 run with dropout, resumed from its step-15 checkpoint: masks
# are a function of the step and the global samples, so the resumed run
# draws the masks the uninterrupted one drew and stays bitwise.
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(pp 2) --set model.dropout=0.1 --set training.max_steps=30 \
  --set checkpoint.interval=15 --set run.output_dir="$WORK/drop" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "dropout run"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(pp 2) --set model.dropout=0.1 --set training.max_steps=30 \
  --set checkpoint.resume="$WORK/drop/checkpoints/step_00000015" --set run.output_dir="$WORK/drop2" > "$WORK/log" 2>&1 \
  || { cat "$WORK/log"; fail "dropout resume"; }
echo "== pp2 with dropout resumed from its own checkpoint"
"$BIN/hp-compare" "$WORK/drop" "$WORK/drop2" --from-step 16 --exact --phase resume | tail -2 || fail "pp2 dropout resume not bitwise"
# The 1f1b checkpoint resumed with zb_h1 (B and W apart), dropout on: the
# checkpoint is the same either way and zb_h1 computes 1f1b's numbers.
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(pp 2) --set model.dropout=0.1 --set training.max_steps=30 \
  --set features.pipeline_parallel.schedule=zb_h1 --set checkpoint.resume="$WORK/drop/checkpoints/step_00000015" \
  --set run.output_dir="$WORK/dropzb" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "zb_h1 resume"; }
echo "== pp2 1f1b checkpoint resumed with zb_h1, dropout on"
"$BIN/hp-compare" "$WORK/drop" "$WORK/dropzb" --from-step 16 --exact --phase "zb_h1 resume" | tail -2 \
  || fail "zb_h1 resumed from a 1f1b checkpoint not bitwise"
# And with zbv (two chunks per stage in a V: the stages hold other blocks
# than the checkpoint's writers did).
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(pp 2) --set model.dropout=0.1 --set training.max_steps=30 \
  --set features.pipeline_parallel.schedule=zbv --set checkpoint.resume="$WORK/drop/checkpoints/step_00000015" \
  --set run.output_dir="$WORK/dropzbv" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "zbv resume"; }
echo "== pp2 1f1b checkpoint resumed with zbv, dropout on"
"$BIN/hp-compare" "$WORK/drop" "$WORK/dropzbv" --from-step 16 --exact --norm-rtol 1e-14 --phase "zbv resume" | tail -2 \
  || fail "zbv resumed from a 1f1b checkpoint not bitwise"
for r in pp1 pp4; do
  echo "== $r resumed from the pp=2 checkpoint"
  "$BIN/hp-compare" "$WORK/pp2" "$WORK/$r" --from-step 21 --first-loss-rtol 1e-6 --loss-rtol 1e-6 --norm-rtol 1e-5 --phase resume | tail -2 \
    || fail "$r"
done
echo PASS
