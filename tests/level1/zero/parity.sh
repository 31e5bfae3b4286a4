#!/usr/bin/env bash
# zero (ZeRO-1) against plain data parallel and against one process:
# dp=2 + zero vs dp=2 (20-step losses and first-step gradients within 1e-6),
# and dp=2, tp=2 x dp=2 and pp=2 x dp=2 with zero vs one process
# (docs/PARITY.md: first-step loss and every gradient 1e-5, 20-step losses 1e-4);
# zero with recompute bitwise equal to zero without. Stage 2 (gradients
# sharded too) bitwise equal to stage 1 at dp=2 (blocking and overlapped),
# tp=2 x dp=2, and within the bars of one process at dp=4; after the
# reduction a stage-2 rank holds no full gradient and its slices' only.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1)
# Reduced once per step (reduce_per_micro_batch: false): stage 2 sums as
# stage 1 does, so their numbers are equal bitwise.
zero=(--set features.zero.enabled=true --set features.zero.reduce_per_micro_batch=false)
run ref 1
run dp2 2
run dp2z 2 "${zero[@]}"
run tp2dp2z 4 "${zero[@]}" --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
run pp2dp2z 4 "${zero[@]}" --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
run dp2zrc 2 "${zero[@]}" --set features.recompute.enabled=true
run dp2z2 2 "${zero[@]}" --set features.zero.stage=2
run dp2z2ov 2 "${zero[@]}" --set features.zero.stage=2 --set distributed.overlap=true --set distributed.bucket_size_mb=0.004
run tp2dp2z2 4 "${zero[@]}" --set features.zero.stage=2 --set features.tensor_parallel.enabled=true \
  --set features.tensor_parallel.size=2
run dp4z2 4 "${zero[@]}" --set features.zero.stage=2
echo "== dp=2 + zero against dp=2"
"$BIN/hp-compare" "$WORK/dp2" "$WORK/dp2z" --grads-step 1 --first-loss-rtol 1e-6 --loss-rtol 1e-6 --norm-rtol 1e-5 --grad-rtol 1e-6 \
  --phase "zero's reduce-scatter or sharded update" || fail "dp2 + zero vs dp2"
for pair in "dp2z dp2z2" "dp2z dp2z2ov" "tp2dp2z tp2dp2z2"; do
  read -r a b <<<"$pair"
  echo "== stage 2 ($b) against stage 1 ($a)"
  "$BIN/hp-compare" "$WORK/$a" "$WORK/$b" --exact --grads-step 1 --grad-rtol 0 --phase "zero stage 2's released gradients" \
    || fail "$b vs $a"
done
for r in dp2z tp2dp2z pp2dp2z dp4z2; do
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
# Gradient memory after the reduction, every step: stage 1 keeps each full
# gradient (4 bytes a parameter) with its reduced slice stored inside it (no
# second buffer); stage 2 only the slices, half of stage 1's full bytes.
python3 - "$WORK/dp2z" "$WORK/dp2z2" "$WORK/dp2z2ov" <<'PY' || fail "stage 2 gradient bytes"
import json, sys
def figures(d):
    return [j for j in map(json.loads, open(d + "/metrics.jsonl")) if "zero_full_grad_bytes" in j]
s1 = figures(sys.argv[1])
full1, slice1 = s1[-1]["zero_full_grad_bytes"], s1[-1]["zero_slice_grad_bytes"]
print(f"stage 1, rank 0: full gradients {full1:.0f} bytes, slices {slice1:.0f}")
ok = full1 > 0 and slice1 == 0
for d in sys.argv[2:]:
    rows = figures(d)
    full = max(j["zero_full_grad_bytes"] for j in rows)
    slices = rows[-1]["zero_slice_grad_bytes"]
    print(f"stage 2 ({d.rsplit('/', 1)[-1]}), rank 0: full gradients at most {full:.0f} bytes over {len(rows)} steps, slices {slices:.0f}")
    ok = ok and full == 0 and abs(slices / full1 - 0.5) <= 0.01
sys.exit(0 if ok else 1)
PY
echo PASS
