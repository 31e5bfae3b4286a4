#!/usr/bin/env bash
# Context parallel on a mixture-of-experts GPT against one process (docs/PARITY.md
# bars): the router's per-sequence statistics (load-balancing loss, capacity,
# the aux-loss-free bias counts) are summed or gathered over the cp ranks, so
# cp=2 computes the one-process numbers; dropless and with capacity dropping
# at 2 ranks without expert parallel, and with ep=2 folded over the two cp
# ranks (experts split over what attention sees as cp), its expert gradients
# summed over nothing else (edp=1).
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1 --set model.moe.num_experts=4 --set model.moe.top_k=2
        --set model.moe.z_loss_coef=0.001)
cap=(--set model.moe.capacity_factor=1.0)
cp2=(--set features.context_parallel.enabled=true --set features.context_parallel.size=2)
compare() { compare_b4 "$1" "$2" "router statistics over cp"; }
run ref 1
run ref_cap 1 "${cap[@]}"
run cp2 2 "${cp2[@]}"
run cp2_cap 2 "${cp2[@]}" "${cap[@]}"
run cp2ep2 2 "${cp2[@]}" --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2 \
  --set model.moe.bias_update_rate=0.001
grep -q "mesh dp=1 cp=2 ep=2 edp=1 over 2 ranks" "$WORK/cp2ep2.log" || fail "ep is not folded over cp: $(grep -m1 'mesh ' "$WORK/cp2ep2.log")"
run ref_bias 1 --set model.moe.bias_update_rate=0.001
compare ref cp2
compare ref_cap cp2_cap
python3 - "$WORK/ref_cap" <<'PY' || fail "capacity dropped nothing: the capacity run is not a test of it"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
assert max(r.get("moe_dropped_fraction_max", 0) for r in rows) > 0
PY
compare ref_bias cp2ep2
echo PASS
