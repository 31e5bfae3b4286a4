#!/usr/bin/env bash
# Checkpoints are layout-free under context parallel: a cp=2 checkpoint
# (gathered) resumes at one process with the losses of the uninterrupted
# cp=2 run (within 1e-4), and at cp=2 again bitwise; a sharded one (every
# rank writes, in the background) resumes at cp=4, same bar.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
cp() { echo --set features.context_parallel.enabled=true --set features.context_parallel.size="$1"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(cp 2) --set training.max_steps=40 --set checkpoint.interval=20 \
  --set run.output_dir="$WORK/cp2" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "cp=2 run"; }
ck="$WORK/cp2/checkpoints/step_00000020"
[[ -d "$ck" ]] || fail "no step-20 checkpoint"
resume() {  # name nproc [args]
  local name=$1 n=$2
  shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" --set training.max_steps=40 --set checkpoint.resume="$ck" \
    --set run.output_dir="$WORK/$name" "$@" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$name resume"; }
  grep -q "resumed from .* at step 20" "$WORK/log" || fail "$name did not resume"
}
resume cp1 1
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(cp 2) --set training.max_steps=40 --set checkpoint.interval=20 \
  --set features.sharded_checkpoint.enabled=true --set features.sharded_checkpoint.async=true \
  --set run.output_dir="$WORK/cp2sharded" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "cp=2 sharded run"; }
"$BIN/hp-compare" "$WORK/cp2" "$WORK/cp2sharded" --exact --phase "sharded checkpoint writes" > /dev/null \
  || fail "saving sharded checkpoints changed the cp=2 run"
ck="$WORK/cp2sharded/checkpoints/step_00000020"
[[ -f "$ck/manifest.json" ]] || fail "no sharded step-20 checkpoint"
# shellcheck disable=SC2046
resume cp4 4 $(cp 4) --set features.sharded_checkpoint.enabled=true
ck="$WORK/cp2/checkpoints/step_00000020"
# shellcheck disable=SC2046
resume cp2again 2 $(cp 2)
resumed_bitwise cp2 cp2again 21
resumed_within cp2 21 cp1 cp4
echo PASS
