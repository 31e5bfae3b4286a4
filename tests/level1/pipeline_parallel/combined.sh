#!/usr/bin/env bash
# Pipeline with tensor and data parallel (4 processes): pp=2 x tp=2 and
# pp=2 x dp=2 against one process, losses within 1e-4 and first-step
# gradients within 1e-5; pp=2 with recompute is bitwise equal to pp=2.
# zb_h1 (B and W apart) bitwise equal to the other schedules: at pp=2 x
# tp=2 (column and row parallel products split), at pp=2 x dp=2 (the
# gradient reduction with overlap, its buckets cued by W) and at
# pp=2 with recompute (W reuses what the replay inside B saved); with ZeRO-2
# (gradients reduced per micro-batch, in another order) within the bars.
# zbv (two chunks per stage in a V) the same at pp=2 x dp=2 and with
# recompute, its gradient norm within 1e-14 (other stage sums); with tensor
# and sequence parallel (sums in another grouping) and with ZeRO-3 (at 4
# layers) within the bars. zb_h1 plans its steps after the third from the
# third's measured costs, the equal-cost plan before.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1)
pp=(--set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2)
"$BIN/hp-train" "$WORK/c.yaml" "${common[@]}" --set run.output_dir="$WORK/ref" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "reference"; }
# A zero-bubble run's plan: the equal-cost one for training steps 1-3,
# then the one made from step 3's measured costs (its B and W as the log
# gives them) for every later step.
planned_from_step3() {  # name
  python3 - "$WORK/$1/metrics.jsonl" "$WORK/log" <<'PY' || fail "$1: the zero-bubble plan's steps"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"pipeline_plan_b_over_f"' in l]
m = re.search(r"planned from step 3's measured costs: B ([0-9.]+) F, W ([0-9.]+) F", open(sys.argv[2]).read())
assert m, "no plan from step 3's costs in the log"
b, w = map(float, m.groups())
assert max(r["step"] for r in rows) > 3, "no step after the third"
for r in rows:
    want = (1.0, 1.0) if r["step"] <= 3 else (b, w)
    assert (r["pipeline_plan_b_over_f"], r["pipeline_plan_w_over_f"]) == want, (r["step"], want)
print(f"plan: equal costs for steps 1-3, then B {b} F, W {w} F")
PY
}
run() {  # name nproc mesh args...
  local name=$1 n=$2 mesh=$3; shift 3
  "$BIN/hp-train" "$WORK/c.yaml" --nproc $n "${common[@]}" "${pp[@]}" --set run.output_dir="$WORK/$name" "$@" \
    > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$name run"; }
  grep -q "mesh $mesh" "$WORK/log" || fail "$name: wrong mesh"
}
compare() {  # ref run args...
  echo "== $2 against $1"
  "$BIN/hp-compare" "$WORK/$1" "$WORK/$2" "${@:3}" | tail -3
  [[ ${PIPESTATUS[0]} -eq 0 ]] || fail "$2 against $1"
}
run pp2tp2 4 "pp=2 dp=1 tp=2" --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
compare ref pp2tp2 --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --eval-rtol 1e-5 --grad-rtol 1e-5 --phase "pp x tp steps"
run pp2tp2zb 4 "pp=2 dp=1 tp=2" --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set features.pipeline_parallel.schedule=zb_h1
compare pp2tp2 pp2tp2zb --exact --grads-step 1 --grad-rtol 0 --phase "zb_h1 with tensor parallel"
run pp2tp2zbv 4 "pp=2 dp=1 tp=2" --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set features.pipeline_parallel.schedule=zbv --set features.tensor_parallel.sequence_parallel=true
compare pp2tp2 pp2tp2zbv --grads-step 1 --first-loss-rtol 1e-6 --loss-rtol 1e-5 --grad-rtol 1e-5 \
  --phase "zbv with tensor and sequence parallel"
run pp2dp2 4 "pp=2 dp=2 over" --set features.pipeline_parallel.schedule=gpipe
compare ref pp2dp2 --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --eval-rtol 1e-5 --grad-rtol 1e-5 --phase "pp x dp steps"
run pp2 2 "pp=2 dp=1 over"
run pp2rc 2 "pp=2 dp=1 over" --set features.recompute.enabled=true
replayed_every_step "$WORK/pp2rc" || fail "recompute did not run at pp=2"
compare pp2 pp2rc --exact --grads-step 1 --grad-rtol 0 --phase recompute
run pp2dp2zb 4 "pp=2 dp=2 over" --set features.pipeline_parallel.schedule=zb_h1
planned_from_step3 pp2dp2zb
compare pp2dp2 pp2dp2zb --exact --grads-step 1 --grad-rtol 0 --phase "zb_h1 steps"
run pp2dp2zbv 4 "pp=2 dp=2 over" --set features.pipeline_parallel.schedule=zbv
compare pp2dp2 pp2dp2zbv --exact --norm-rtol 1e-14 --grads-step 1 --grad-rtol 0 --phase "zbv steps"
run pp2dp2zbz2 4 "pp=2 dp=2 over" --set features.pipeline_parallel.schedule=zb_h1 --set features.zero.enabled=true \
  --set features.zero.stage=2
compare pp2dp2 pp2dp2zbz2 --grads-step 1 --first-loss-rtol 1e-6 --loss-rtol 1e-5 --grad-rtol 1e-5 --phase "zb_h1 with zero-2"
run pp2rczb 2 "pp=2 dp=1 over" --set features.recompute.enabled=true --set features.pipeline_parallel.schedule=zb_h1
planned_from_step3 pp2rczb
replayed_every_step "$WORK/pp2rczb" || fail "recompute did not run at pp=2 with zb_h1"
compare pp2rc pp2rczb --exact --grads-step 1 --grad-rtol 0 --phase "zb_h1 with recompute"
# 4 layers: under zbv the first stage holds the embedding, the head and a
# transformer block each end (with 2 layers it would hold no block to replay
# and the logging rank would show no replay).
run pp2rc4 2 "pp=2 dp=1 over" --set features.recompute.enabled=true --set model.layers=4
run pp2rczbv 2 "pp=2 dp=1 over" --set features.recompute.enabled=true --set model.layers=4 \
  --set features.pipeline_parallel.schedule=zbv
replayed_every_step "$WORK/pp2rczbv" || fail "recompute did not run at pp=2 with zbv"
compare pp2rc4 pp2rczbv --exact --norm-rtol 1e-14 --grads-step 1 --grad-rtol 0 --phase "zbv with recompute"
# zbv with ZeRO-3 at 4 layers: a stage's W of a block runs after ZeRO-3
# released the block's gathered weights (with 2 layers it never did), so
# the layer norms' W must not read them.
run pp2dp2zbvz3 4 "pp=2 dp=2 over" --set features.pipeline_parallel.schedule=zbv --set features.zero.enabled=true \
  --set features.zero.stage=3 --set model.layers=4
compare pp2rc4 pp2dp2zbvz3 --grads-step 1 --first-loss-rtol 1e-6 --loss-rtol 1e-5 --grad-rtol 1e-5 --phase "zbv with zero-3"
echo PASS
