#!/usr/bin/env bash
# A checkpoint of format version 1 (tests/fixtures/checkpoint_v1, written
# before placements: tensors split over tp, ep, dp and tp then dp) still
# loads: hp-ckpt verifies it; resumed at its layout it gives, bitwise, what
# the same fixture converted offline to the current format (hp-ckpt convert
# at the same layout) gives resumed there, both computed on this machine;
# its logged steps 3 and 4 (computed on the machine that wrote the fixture,
# with whatever BLAS kernel it ran) are reproduced within docs/PARITY.md's
# later-step bar, not bitwise (another machine's rounding is not this
# project's to reproduce); a resume at another layout (dp=2, no tp, no ep)
# runs, and hp-ckpt re-shards it offline to one rank.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
FIX="$(cd "$(dirname "$0")/../../fixtures/checkpoint_v1" && pwd)"
STEP="$FIX/checkpoints/step_00000002"
grep -q '"format_version": 1' "$STEP/manifest.json" || fail "the fixture is not format version 1"
"$BIN/hp-ckpt" verify "$STEP" || fail "hp-ckpt verify refused the version-1 fixture"
layout=(--set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
        --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2
        --set features.zero.enabled=true --set features.sharded_checkpoint.enabled=true)
run() {
  local name=$1 n=$2 from=$3; shift 3
  "$BIN/hp-train" "$FIX/config.yaml" --nproc "$n" --set checkpoint.resume="$from" --set checkpoint.interval=0 \
    --set run.output_dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "run $name"; }
}
# Its steps were logged with the experts through BLAS (expert_compute:
# slices, the default then); the packed-weight product rounds differently.
run same 4 "$STEP" "${layout[@]}" --set model.moe.expert_compute=slices
"$BIN/hp-ckpt" convert "$STEP" --to "$WORK/v2" --tp 2 --dp 2 --ep 2 > "$WORK/convert_v2.log" 2>&1 \
  || { cat "$WORK/convert_v2.log"; fail "hp-ckpt convert of the version-1 fixture at its own layout"; }
grep -q '"format_version": 1' "$WORK/v2/step_00000002/manifest.json" && fail "the converted fixture is still version 1"
run converted 4 "$WORK/v2/step_00000002" "${layout[@]}" --set model.moe.expert_compute=slices
"$BIN/hp-compare" "$WORK/converted" "$WORK/same" --from-step 3 --exact --phase resume \
  || fail "the version-1 fixture resumed differs from the same checkpoint converted to the current format"
mkdir -p "$WORK/fixture" && cp "$FIX/metrics.jsonl" "$WORK/fixture/"
"$BIN/hp-compare" "$WORK/fixture" "$WORK/same" --from-step 3 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase resume \
  || fail "resuming the version-1 fixture at its layout is not within 1e-4 of its logged steps 3 and 4"
run other 2 "$STEP"
[[ -n "$(loss_at "$WORK/other" 4)" ]] || fail "the resume at dp=2 logged no step 4"
"$BIN/hp-ckpt" convert "$STEP" --to "$WORK/one" > "$WORK/convert.log" 2>&1 \
  || { cat "$WORK/convert.log"; fail "hp-ckpt convert of the version-1 fixture to one rank"; }
"$BIN/hp-ckpt" verify "$WORK/one" || fail "the converted fixture does not verify"
echo PASS
