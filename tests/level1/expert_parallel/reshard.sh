#!/usr/bin/env bash
# An ep=2 checkpoint (stacked expert parameters split over ep, optimizer
# state included) resumes at ep=1 and at ep=4, continuing within 1e-4 of the
# uninterrupted ep=2 run; at ep=2 again, bitwise.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
moe=(--set model.moe.num_experts=4 --set model.moe.top_k=2 --set training.max_steps=40)
ep() { echo --set features.expert_parallel.enabled=true --set features.expert_parallel.size="$1"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${moe[@]}" $(ep 2) --set checkpoint.interval=20 \
  --set run.output_dir="$WORK/ep2" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "ep=2 run"; }
ck="$WORK/ep2/checkpoints/step_00000020"
[[ -d "$ck" ]] || fail "no step-20 checkpoint"
"$BIN/hp-train" "$WORK/c.yaml" "${moe[@]}" --set checkpoint.resume="$ck" --set run.output_dir="$WORK/ep1" \
  > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "ep=1 resume"; }
grep -q "resumed from .* at step 20" "$WORK/log" || fail "ep=1 did not resume"
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 4 "${moe[@]}" $(ep 4) --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/ep4" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "ep=4 resume"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${moe[@]}" $(ep 2) --set checkpoint.resume="$ck" \
  --set run.output_dir="$WORK/ep2b" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "ep=2 resume"; }
for r in ep1 ep4; do
  echo "== $r resumed from the ep=2 checkpoint"
  "$BIN/hp-compare" "$WORK/ep2" "$WORK/$r" --from-step 21 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase resume || fail "$r"
done
echo "== ep=2 resumed at ep=2"
"$BIN/hp-compare" "$WORK/ep2" "$WORK/ep2b" --from-step 21 --exact --phase resume || fail "ep2 same layout"
echo "== the aux-free bias is saved with the model: a resume continues bitwise"
bias=(--set model.moe.bias_update_rate=0.001 --set model.moe.aux_loss_coef=0)
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${moe[@]}" "${bias[@]}" $(ep 2) --set checkpoint.interval=20 \
  --set run.output_dir="$WORK/b2" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "bias run"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${moe[@]}" "${bias[@]}" $(ep 2) \
  --set checkpoint.resume="$WORK/b2/checkpoints/step_00000020" --set run.output_dir="$WORK/b2r" > "$WORK/log" 2>&1 \
  || { cat "$WORK/log"; fail "bias resume"; }
"$BIN/hp-compare" "$WORK/b2" "$WORK/b2r" --from-step 21 --exact --phase "resume of the router bias" || fail "bias resume"
echo PASS
