#!/usr/bin/env bash
# Checkpoints hold the fp32 masters whichever precision wrote them, so bf16
# and fp32 runs resume from each other's at any layout; the precision is a
# training choice, logged on a resume that changes it, never refused.
#   a bf16 checkpoint resumes in bf16 at its layout bitwise (docs/PARITY.md
#   B2), and in fp32 at dp=2 and at one process, which agree at the fp32
#   bar (B9: the masters loaded are the same at every layout);
#   an fp32 checkpoint resumes in bf16 at tp=2 and at one process, which
#   agree at the bf16 bars;
#   hp-ckpt inspect names the precision that wrote each.
# 20 steps, checkpoint at 10.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
mp=(--set features.mixed_precision.enabled=true)
common=()  # small_config's 20 steps; run() is tests/lib/common.sh's
export HP_INTRA_OP_THREADS=1
changed() {  # changed RUN FROM TO: the resume logged the precision change
  grep -qF "resuming in another precision: the checkpoint was written in $2, this run trains in $3" "$WORK/$1.log" ||
    { grep -i "resum" "$WORK/$1.log"; fail "$1 did not log the change of precision ($2 -> $3)"; }
}
run b1 1 "${mp[@]}" --set checkpoint.interval=10
bck="$WORK/b1/checkpoints/step_00000010"
[[ -d "$bck" ]] || fail "no step-10 checkpoint of the bf16 run"
run b1again 1 "${mp[@]}" --set checkpoint.resume="$bck"
resumed_bitwise b1 b1again 11
run f2 2 --set checkpoint.resume="$bck"
run f1 1 --set checkpoint.resume="$bck"
changed f2 "bf16 compute (gradient sums in fp32)" fp32
echo "== fp32 at dp=2 against one process, both resumed from the bf16 checkpoint"
"$BIN/hp-compare" "$WORK/f1" "$WORK/f2" --from-step 11 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase resume \
  || fail "fp32 resumes of a bf16 checkpoint differ between layouts"
run p1 1 --set checkpoint.interval=10
pck="$WORK/p1/checkpoints/step_00000010"
run bt2 2 "${mp[@]}" --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set checkpoint.resume="$pck"
run bt1 1 "${mp[@]}" --set checkpoint.resume="$pck"
changed bt2 fp32 "bf16 compute (gradient sums in fp32)"
echo "== bf16 at tp=2 against one process, both resumed from the fp32 checkpoint"
"$BIN/hp-compare" "$WORK/bt1" "$WORK/bt2" --from-step 11 --first-loss-rtol 1e-2 --loss-rtol 1e-2 --phase resume \
  || fail "bf16 resumes of an fp32 checkpoint differ between layouts beyond the bf16 bar"
"$BIN/hp-ckpt" inspect "$bck" > "$WORK/ib" || fail "hp-ckpt inspect $bck"
grep -q "^precision    bf16 compute (gradient sums in fp32); tensors are the fp32 masters" "$WORK/ib" \
  || { cat "$WORK/ib"; fail "hp-ckpt inspect does not say bf16 wrote $bck"; }
# (Into files, not pipes: grep -q stops reading at the first match, and
# under pipefail the writer's broken pipe would fail the check.)
"$BIN/hp-ckpt" inspect "$pck" > "$WORK/ip" || fail "hp-ckpt inspect $pck"
grep -q "^precision    fp32;" "$WORK/ip" || { cat "$WORK/ip"; fail "hp-ckpt inspect does not say fp32 wrote $pck"; }
"$BIN/hp-ckpt" inspect --json "$bck" > "$WORK/ij" || fail "hp-ckpt inspect --json $bck"
grep -q '"precision": "bf16 compute' "$WORK/ij" || fail "hp-ckpt inspect --json lacks the precision"
echo PASS
