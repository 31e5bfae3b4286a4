#!/usr/bin/env bash
# Gathered and sharded checkpoints load through the same reader: a dp=2
# checkpoint written without the feature resumes with it, a sharded one
# (zero: each rank's optimizer slice, written once) resumes without it, both
# bitwise at the same layout; keep=2 leaves only the newest two steps, and a save
# that fails in the background stops the run naming the rank and file while
# `latest` still names the last committed step.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
steps=(--set training.max_steps=40)
sharded=(--set features.sharded_checkpoint.enabled=true)
run() {
  local name=$1 n=$2; shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${steps[@]}" "$@" --set run.output_dir="$WORK/$name" \
    > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "run $name"; }
}
run plain 2 --set checkpoint.interval=20
run plain_to_sharded 2 "${sharded[@]}" --set checkpoint.resume="$WORK/plain/checkpoints/step_00000020"
"$BIN/hp-compare" "$WORK/plain" "$WORK/plain_to_sharded" --from-step 21 --exact --phase resume || fail "gathered -> sharded"

run zs 2 --set features.zero.enabled=true "${sharded[@]}" --set checkpoint.interval=10 --set checkpoint.keep=2
[[ "$(cd "$WORK/zs/checkpoints" && echo step_*)" == "step_00000030 step_00000040" ]] \
  || fail "keep=2 should leave steps 30 and 40, found: $(ls "$WORK/zs/checkpoints")"
[[ "$(cat "$WORK/zs/checkpoints/latest")" == step_00000040 ]] || fail "latest is not step 40"
run zs_to_plain 2 --set features.zero.enabled=true --set checkpoint.resume="$WORK/zs/checkpoints/step_00000030"
"$BIN/hp-compare" "$WORK/zs" "$WORK/zs_to_plain" --from-step 31 --exact --phase resume || fail "sharded -> gathered"

echo "== a background write that fails stops the run"
HP_FAULT_INJECT=checkpoint.async_write "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${steps[@]}" "${sharded[@]}" \
  --set features.sharded_checkpoint.async=true --set checkpoint.interval=20 --set run.output_dir="$WORK/bad" \
  > "$WORK/bad.log" 2>&1 && fail "the run succeeded although its checkpoint write failed"
grep -E "rank [01]: checkpoint step 20: writing model-rank0000[01].safetensors .* failed: cannot write model-rank0000[01].safetensors \(tensor '[a-z0-9_.]+'\): injected" "$WORK/bad.log" \
  || { tail -20 "$WORK/bad.log"; fail "the failure does not name the rank, the file and the tensor"; }
[[ ! -e "$WORK/bad/checkpoints/latest" ]] || fail "latest was written for a failed save"
echo PASS
