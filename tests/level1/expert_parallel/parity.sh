#!/usr/bin/env bash
# docs/PARITY.md for expert parallel: every layout against one process with the
# same global batch and micro-batches (first-step loss and every gradient
# by global name within 1e-5, losses within 1e-4: 50 steps where the MoE
# balancing shows (ep=2 and the aux-loss-free bias layout), 20 for the other
# layouts, the docs/PARITY.md minimum), dropless (capacity dropping:
# capacity.sh); recompute on vs off bitwise; ep=2 x pp=2 with schedule zbv
# bitwise to 1f1b's (gradient norm within 1e-14); ep=2 with block
# attention (model.attention: block) against the eager reference; the
# experts through BLAS (model.moe.expert_compute: slices) against the
# packed-weight product. ep4 and ep2tp2 run the experts' AVX2 packed kernel
# (HP_PACKED_GEMM_KERNEL=avx2: the same forward bits, weight gradients
# through BLAS) against a reference on the CPU's best; the logs say which ran.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
# Every run has the device-level balance loss (DeepSeek-V2's) over two
# expert groups (the ep=2 ranks' experts) beside the expert-level one.
common=(--set training.max_steps=50 --set training.dump_grads_at_step=1 --set model.moe.num_experts=4
        --set model.moe.top_k=2 --set model.moe.z_loss_coef=0.001 --set model.moe.device_balance_coef=0.05
        --set model.moe.device_groups=2)
ep() { echo --set features.expert_parallel.enabled=true --set features.expert_parallel.size="$1"; }
short=(--set training.max_steps=20)  # layouts whose difference shows from the first steps
compare() { compare_b4 "$1" "$2" "expert dispatch, combine or gradient sync"; }
# Shared experts, MoE in every other block, aux-loss-free bias (updated from
# global counts after each step) and no balance loss, sigmoid scores,
# evaluation in between.
var=(--set model.moe.shared_experts=1 --set model.moe.every=2 --set model.moe.bias_update_rate=0.001
     --set model.moe.score=sigmoid --set model.moe.aux_loss_coef=0 --set model.moe.device_balance_coef=0
     --set training.eval_interval=10)
run ref 1
run ref20 1 "${short[@]}"  # the same schedule as the 20-step layouts (max_steps sets the decay)
# The experts through BLAS (slices) against the packed-weight product (the default).
run ref20_slices 1 "${short[@]}" --set model.moe.expert_compute=slices
run ref_var 1 "${var[@]}"
# shellcheck disable=SC2046
{
run ep2 2 $(ep 2)
run ep2dp4 4 "${short[@]}" $(ep 2)
HP_PACKED_GEMM_KERNEL=avx2 run ep4 4 "${short[@]}" $(ep 4)
HP_PACKED_GEMM_KERNEL=avx2 run ep2tp2 4 "${short[@]}" $(ep 2) --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
run ep2pp2 4 "${short[@]}" $(ep 2) --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
run ep2pp2zbv 4 "${short[@]}" $(ep 2) --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2 \
  --set features.pipeline_parallel.schedule=zbv
run ep2zero 2 "${short[@]}" $(ep 2) --set features.zero.enabled=true
run tp2 2 "${short[@]}" --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
run ep2rc 2 $(ep 2) --set features.recompute.enabled=true
run ep2_var 2 $(ep 2) "${var[@]}"
run ep2block 2 "${short[@]}" $(ep 2) --set model.attention=block --set model.attention_block=12
}
for r in ref ep4; do grep -h -m1 "packed expert products" "$WORK/$r.log" | sed "s/.*\] /$r: /"; done
compare ref ep2
for r in ep2dp4 ep4 ep2tp2 ep2pp2 ep2zero tp2 ep2block ref20_slices; do compare ref20 $r; done
compare ref_var ep2_var
python3 - "$WORK/ref" "$WORK/ep2" <<'PY' || fail "the device-level balance loss is missing or zero"
import json, sys
for run in sys.argv[1:]:
    r = [json.loads(l) for l in open(run + "/metrics.jsonl") if l.strip()]
    v = [x["aux_loss_device_balance"] for x in r]
    assert min(v) > 0, run
    print(f"{run.rsplit('/', 1)[1]}: device-level balance loss {v[0]:.5f} at step 1, {v[-1]:.5f} at step {len(v)}")
PY
echo "== ep2pp2 with zbv (B and W apart, chunks in a V) against ep2pp2 (1f1b)"
"$BIN/hp-compare" "$WORK/ep2pp2" "$WORK/ep2pp2zbv" --exact --norm-rtol 1e-14 --grads-step 1 --grad-rtol 0 \
  --phase "zbv with expert parallel" | tail -2 || fail "ep x zbv"
echo "== recompute on vs off (ep=2)"
replayed_every_step "$WORK/ep2rc" || fail "recompute did not run at ep=2"
"$BIN/hp-compare" "$WORK/ep2" "$WORK/ep2rc" --exact --grads-step 1 --grad-rtol 0 --phase "recompute replay" || fail "recompute"
echo PASS
