#!/usr/bin/env bash
# zero (ZeRO-1) against plain data parallel and against one process:
# dp=2 + zero vs dp=2 (20-step losses and first-step gradients within 1e-6),
# and dp=2, tp=2 x dp=2 and pp=2 x dp=2 with zero vs one process
# (docs/PARITY.md: first-step loss and every gradient 1e-5, 20-step losses 1e-4);
# zero with recompute bitwise equal to zero without.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1)
zero=(--set features.zero.enabled=true)
run() {  # NAME NPROC ARGS...
  local name=$1 n=$2; shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${common[@]}" "$@" --set run.output_dir="$WORK/$name" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name run"; }
}
run ref 1
run dp2 2
run dp2z 2 "${zero[@]}"
run tp2dp2z 4 "${zero[@]}" --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
run pp2dp2z 4 "${zero[@]}" --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
run dp2zrc 2 "${zero[@]}" --set features.recompute.enabled=true
echo "== dp=2 + zero against dp=2"
"$BIN/hp-compare" "$WORK/dp2" "$WORK/dp2z" --grads-step 1 --first-loss-rtol 1e-6 --loss-rtol 1e-6 --norm-rtol 1e-5 --grad-rtol 1e-6 \
  --phase "zero's reduce-scatter or sharded update" || fail "dp2 + zero vs dp2"
for r in dp2z tp2dp2z pp2dp2z; do
  echo "== $r against one process"
  "$BIN/hp-compare" "$WORK/ref" "$WORK/$r" --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --eval-rtol 1e-5 --grad-rtol 1e-5 \
    --phase "zero's reduce-scatter or sharded update" || fail "$r vs one process"
done
echo "== dp=2 + zero with recompute against without"
replayed_every_step "$WORK/dp2zrc" || fail "recompute did not run under zero"
"$BIN/hp-compare" "$WORK/dp2z" "$WORK/dp2zrc" --exact --grads-step 1 --grad-rtol 0 --phase "recompute under zero" \
  || fail "zero + recompute"
# Each replica holds half of the optimizer state.
python3 - "$WORK/dp2" "$WORK/dp2z" <<'PY' || fail "state bytes"
import json, sys
def bytes_of(d):
    return [json.loads(l)["optimizer_state_bytes"] for l in open(d + "/metrics.jsonl") if l.strip()][-1]
full, mine = bytes_of(sys.argv[1]), bytes_of(sys.argv[2])
print(f"optimizer state on rank 0: {mine:.0f} bytes with zero, {full:.0f} without ({mine / full:.4f})")
sys.exit(0 if abs(mine / full - 0.5) <= 0.01 else 1)
PY
echo PASS
