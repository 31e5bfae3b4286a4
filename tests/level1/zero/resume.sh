#!/usr/bin/env bash
# A zero dp=2 checkpoint (sharded optimizer state, saved by global name)
# resumes at dp=2 with zero bitwise, and at dp=1 without zero and at dp=4
# with it within 1e-4 of the uninterrupted run; a plain dp=2 checkpoint
# resumes under zero at dp=2 within 1e-6 (zero's bar against plain dp: its
# gradient norm sums the slices' squares in another order, 1 ulp apart, so
# switching zero on is not the same configuration). 20 steps, checkpoint at 10.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
zero=(--set features.zero.enabled=true)
common=()  # small_config's 20 steps; run() is tests/lib/common.sh's
run z2 2 "${zero[@]}" --set checkpoint.interval=10
ck="$WORK/z2/checkpoints/step_00000010"
[[ -d "$ck" ]] || fail "no step-10 checkpoint"
run z2again 2 "${zero[@]}" --set checkpoint.resume="$ck"
run d1 1 --set checkpoint.resume="$ck"
grep -q "resumed from .* at step 10" "$WORK/d1.log" || fail "dp=1 did not resume"
run z4 4 "${zero[@]}" --set checkpoint.resume="$ck"
resumed_bitwise z2 z2again 11
resumed_within z2 11 d1 z4
echo "== zero dp=2 resumed from a plain dp=2 checkpoint (same layout, zero switched on)"
run p2 2 --set checkpoint.interval=10
run pz 2 "${zero[@]}" --set checkpoint.resume="$WORK/p2/checkpoints/step_00000010"
"$BIN/hp-compare" "$WORK/p2" "$WORK/pz" --from-step 11 --first-loss-rtol 1e-6 --loss-rtol 1e-6 --norm-rtol 1e-6 \
  --phase resume || fail "plain -> zero"
echo PASS
