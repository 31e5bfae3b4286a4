#!/usr/bin/env bash
# A tp=2 x pp=2 run saves sharded checkpoints in the background (no gather:
# every rank writes its own slices) at steps 20 and 40. From step 20 it
# resumes at the same layout bitwise, and within 1e-4 of the uninterrupted
# run at one process (without the feature: the built-in reader), at tp=4,
# and at dp=2 with zero; an MoE ep=2 sharded checkpoint resumes at ep=4.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
steps=(--set training.max_steps=40)
sharded=(--set features.sharded_checkpoint.enabled=true --set features.sharded_checkpoint.async=true)
tp() { echo --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size="$1"; }
pp() { echo --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size="$1"; }
run() {  # run NAME NPROC ARGS...: a run into $WORK/NAME, failing the test with its log
  local name=$1 n=$2; shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${steps[@]}" "$@" --set run.output_dir="$WORK/$name" \
    > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "run $name"; }
}
# shellcheck disable=SC2046
run a 4 $(tp 2) $(pp 2) "${sharded[@]}" --set checkpoint.interval=20
ck="$WORK/a/checkpoints/step_00000020"
[[ -f "$ck/manifest.json" ]] || fail "no committed step-20 checkpoint"
grep -q "committed in the background" "$WORK/a.log" || fail "the save was not written in the background"
# Four writers, no gathered copy: every rank wrote model and optimizer slices.
for r in 0 1 2 3; do
  [[ -f "$ck/model-rank0000$r.safetensors" && -f "$ck/optim-rank0000$r.safetensors" ]] || fail "rank $r wrote no slices"
done
python3 - "$ck/manifest.json" <<'PY' || fail "the tp-split tensors are not stored as slices"
import json, sys
m = json.load(open(sys.argv[1]))
split = [n for n, t in m["tensors"].items() if len(t["shards"]) > 1]
assert split, "no tensor has more than one shard"
print(f"{len(split)} of {len(m['tensors'])} tensors stored as several slices")
PY
# shellcheck disable=SC2046
run same 4 $(tp 2) $(pp 2) "${sharded[@]}" --set checkpoint.resume="$ck"
run one 1 --set checkpoint.resume="$ck"
# shellcheck disable=SC2046
run tp4 4 $(tp 4) "${sharded[@]}" --set checkpoint.resume="$ck"
run zero 2 --set features.zero.enabled=true "${sharded[@]}" --set checkpoint.resume="$ck"
grep -q "resumed from .* at step 20" "$WORK/one.log" || fail "one process did not resume at 20"
echo "== same layout"
"$BIN/hp-compare" "$WORK/a" "$WORK/same" --from-step 21 --exact --phase resume || fail "same layout is not bitwise"
for r in one tp4 zero; do
  echo "== $r resumed from the tp=2 x pp=2 sharded checkpoint"
  "$BIN/hp-compare" "$WORK/a" "$WORK/$r" --from-step 21 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase resume || fail "$r"
done
echo "== MoE: ep=2 sharded checkpoint resumed at ep=4"
moe=(--set model.moe.num_experts=4 --set model.moe.top_k=2)
ep() { echo --set features.expert_parallel.enabled=true --set features.expert_parallel.size="$1"; }
# shellcheck disable=SC2046
run ep2 2 "${moe[@]}" $(ep 2) "${sharded[@]}" --set checkpoint.interval=20
# shellcheck disable=SC2046
run ep4 4 "${moe[@]}" $(ep 4) "${sharded[@]}" --set checkpoint.resume="$WORK/ep2/checkpoints/step_00000020"
"$BIN/hp-compare" "$WORK/ep2" "$WORK/ep4" --from-step 21 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase resume || fail "ep4"
echo PASS
