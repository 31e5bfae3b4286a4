#!/usr/bin/env bash
# Resume and re-shard of ep=2 x pp=2 (MoE GPT, 4 processes, dropout
# $DROPOUT): the step-10 checkpoint of a 20-step run resumes at ep=2 x pp=2
# bitwise equal to the uninterrupted run (docs/PARITY.md's resume row), and at
# one process and at ep=2 alone within 1e-4 (re-shard: the stacked experts
# split over ep and the blocks split over stages are put back together).
source "$(dirname "$0")/lib.sh"
BIN=$1
CONFIG="$WORK/c.yaml"
small_config "$CONFIG"
COMMON=(--set model.dropout="$DROPOUT" --set training.max_steps=20 --set training.eval_interval=10 --set model.moe.num_experts=4
        --set model.moe.top_k=2 --set model.moe.z_loss_coef=0.001 --set metrics.peak_flops=1e10)
t0=$SECONDS
ck="$WORK/ep2pp2/checkpoints/step_00000010"
# shellcheck disable=SC2046
{
run ep2pp2 4 "pp=2 dp=2 ep=2 edp=1" $(ep 2) $(pp 2) --set checkpoint.interval=10
[[ -d "$ck" ]] || fail "no step-10 checkpoint in $WORK/ep2pp2/checkpoints"
run same 4 "pp=2 dp=2 ep=2 edp=1" $(ep 2) $(pp 2) --set checkpoint.resume="$ck"
run one 1 "" --set checkpoint.resume="$ck"
run ep2 2 "dp=2 ep=2 edp=1" $(ep 2) --set checkpoint.resume="$ck"
}
for r in same one ep2; do
  grep -q "resumed from .* at step 10" "$WORK/$r.log" || fail "$r did not resume from step 10"
done
echo "== ep2 x pp2 resumed at ep2 x pp2, bitwise"
"$BIN/hp-compare" "$WORK/ep2pp2" "$WORK/same" --from-step 11 --exact --phase resume > "$WORK/cmp" 2>&1
report_cmp $? "same-layout resume, bitwise"
for r in one ep2; do
  echo "== ep2 x pp2 resumed at $r"
  "$BIN/hp-compare" "$WORK/ep2pp2" "$WORK/$r" --from-step 11 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase resume \
    > "$WORK/cmp" 2>&1
  report_cmp $? "resume at $r"
done
echo "ep x pp resume: $((SECONDS - t0)) s"
finish
