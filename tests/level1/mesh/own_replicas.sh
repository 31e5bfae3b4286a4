#!/usr/bin/env bash
# A feature's own replicate dimension is served like the data dimension by
# code outside the feature (the test_replicas fixture plugin claims "rp" and
# does nothing else). At 4 processes (rp=2 x dp=2) with experts, against one
# process: the batch is split over all 4 replicas, gradients are summed over
# rp and dp (one all-reduce over the mesh's rp x dp group), the loss's token
# count and the experts' routing counts are summed over both — first-step
# loss and gradients within 1e-5, later losses within 1e-4 (docs/PARITY.md),
# and the routing imbalance of the first steps equal to one process's.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
PLUGINS=$2
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1 --set training.max_steps=8 --set model.moe.num_experts=4)
run() {  # name nproc [extra args]
  local name=$1 n=$2
  shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${common[@]}" --set run.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "run $name"; }
}
run ref 1
run rep 4 --set "plugins.path=[$PLUGINS]" --set features.test_replicas.enabled=true --set features.test_replicas.size=2
grep -qE "mesh .*dp=2.*rp=2|mesh .*rp=2.*dp=2" "$WORK/rep.log" \
  || { grep mesh "$WORK/rep.log" | head -3; fail "the mesh line does not show rp=2 and dp=2"; }
grep -q "dp_rp\|rp_dp" "$WORK/rep.log" \
  || fail "no group joins rp and dp (the replicate role's flat group is missing from the log)"
echo "== rp=2 x dp=2 against one process"
"$BIN/hp-compare" "$WORK/ref" "$WORK/rep" --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --grad-rtol 1e-5 \
  --phase "a plugin's replicate dimension" || fail "parity with a plugin's replicate dimension"
python3 - "$WORK/ref/metrics.jsonl" "$WORK/rep/metrics.jsonl" <<'PY' || fail "the routing counts leave out a replicate dimension"
import json, sys
ref, rep = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:3])
for a, b in zip(ref[:2], rep[:2]):
    x, y = a["moe_load_imbalance_max"], b["moe_load_imbalance_max"]
    assert abs(x - y) <= 1e-6 * abs(x), f"step {a['step']}: load imbalance {y} against one process's {x}"
    print(f"step {a['step']}: load imbalance {y} (one process {x})")
PY
echo PASS
