#!/usr/bin/env bash
# A zero dp=2 checkpoint (sharded optimizer state, saved by global name)
# resumes at dp=1 without zero and at dp=4 with it, continuing within 1e-4
# of the uninterrupted run; and a plain dp=2 checkpoint resumes under zero.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
zero=(--set features.zero.enabled=true)
steps=(--set training.max_steps=40)
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${zero[@]}" "${steps[@]}" --set checkpoint.interval=20 \
  --set run.output_dir="$WORK/z2" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "zero dp=2 run"; }
ck="$WORK/z2/checkpoints/step_00000020"
[[ -d "$ck" ]] || fail "no step-20 checkpoint"
"$BIN/hp-train" "$WORK/c.yaml" "${steps[@]}" --set checkpoint.resume="$ck" --set run.output_dir="$WORK/d1" \
  > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "dp=1 resume"; }
grep -q "resumed from .* at step 20" "$WORK/log" || fail "dp=1 did not resume"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 4 "${zero[@]}" "${steps[@]}" --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/z4" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "zero dp=4 resume"; }
for r in d1 z4; do
  echo "== $r resumed from the zero dp=2 checkpoint"
  "$BIN/hp-compare" "$WORK/z2" "$WORK/$r" --from-step 21 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase resume || fail "$r"
done
echo "== zero dp=2 resumed from a plain dp=2 checkpoint"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${steps[@]}" --set checkpoint.interval=20 --set run.output_dir="$WORK/p2" \
  > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "plain dp=2 run"; }
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${zero[@]}" "${steps[@]}" \
  --set checkpoint.resume="$WORK/p2/checkpoints/step_00000020" --set run.output_dir="$WORK/pz" \
  > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "zero resume of a plain checkpoint"; }
"$BIN/hp-compare" "$WORK/p2" "$WORK/pz" --from-step 21 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase resume || fail "pz"
echo PASS
