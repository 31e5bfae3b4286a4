#!/usr/bin/env bash
# features.zero.reduce_per_micro_batch (stages 2 and 3, as DeepSpeed and
# FSDP reduce): each micro-batch's gradients are reduce-scattered from
# backward and the slices added up, so no rank holds full gradients across
# micro-batches (in the first step, before the gradient counts are known,
# on a guess of one gradient per parameter and micro-batch). The sums run in another order than stage 1's, so the bar
# is one process's (docs/PARITY.md: first-step loss and every gradient
# 1e-5, 20-step losses 1e-4, eval 1e-5): stage 3 at dp=2 and dp=4 (one
# micro-batch a rank: the option changes nothing), stage 2 at dp=2,
# stage 3 at pp=2 x dp=2 (the pipeline's micro-batches). Each step of the
# dp=2 runs, the first included, launches one reduce-scatter per bucket and
# micro-batch; without the option, too, stage 3's first step launches
# every bucket from backward (no full gradients held to its end). Stage 3
# with the option resumes bitwise at the same layout. Stage 1 ignores it
# (it reduces once a step), so a run's resolved config runs again.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1)
z=(--set features.zero.enabled=true --set features.zero.reduce_per_micro_batch=true --set distributed.overlap=true
   --set distributed.bucket_size_mb=0.004)
run ref 1
run dp2z3 2 "${z[@]}" --set features.zero.stage=3 --set checkpoint.interval=10
run dp2z3again 2 "${z[@]}" --set features.zero.stage=3 --set checkpoint.resume="$WORK/dp2z3/checkpoints/step_00000010"
resumed_bitwise dp2z3 dp2z3again 11
run dp2z3once 2 "${z[@]}" --set features.zero.stage=3 --set features.zero.reduce_per_micro_batch=false
run dp2z2 2 "${z[@]}" --set features.zero.stage=2
run dp4z3 4 "${z[@]}" --set features.zero.stage=3
run pp2dp2z3 4 "${z[@]}" --set features.zero.stage=3 --set features.pipeline_parallel.enabled=true \
  --set features.pipeline_parallel.size=2
for r in dp2z3 dp2z2 dp4z3 pp2dp2z3; do
  echo "== $r against one process"
  "$BIN/hp-compare" "$WORK/ref" "$WORK/$r" --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --eval-rtol 1e-5 \
    --grad-rtol 1e-5 --phase "zero's per-micro-batch reduce-scatter" || fail "$r vs one process"
done
# Global batch 8, micro-batch 2: 2 micro-batches a rank at dp=2.
python3 - "$WORK/dp2z3" "$WORK/dp2z3once" "$WORK/dp2z2" <<'PY' || fail "reduce-scatters per step"
import json, sys
def col(d, k):
    return [j[k] for j in map(json.loads, open(d + "/metrics.jsonl")) if k in j]
per, once, s2 = (col(d, "zero_reduce_scatters") for d in sys.argv[1:4])
buckets = col(sys.argv[1], "grad_buckets")
print(f"reduce-scatters per step: per micro-batch {per[:3]}..., once {once[:3]}..., stage 2 {s2[:3]}...; "
      f"{buckets[0]:.0f} buckets")
ok = all(n == 2 * buckets[0] for n in per) and all(n == buckets[0] for n in once)
ok = ok and all(n == 2 * buckets[0] for n in s2)
early = col(sys.argv[2], "grad_buckets_early")
print(f"without the option, buckets launched from backward per step: {early[:3]}...")
ok = ok and all(n == buckets[0] for n in early)
sys.exit(0 if ok else 1)
PY
# A run's resolved config.yaml states the option (true here) and runs again
# at stage 1, which reduces once a step whatever it says.
grep -q "reduce_per_micro_batch: true" "$WORK/dp2z3/config.yaml" || fail "dp2z3's config.yaml does not state the option"
set +e
"$BIN/hp-train" "$WORK/dp2z3/config.yaml" --nproc 2 --dry-run --set features.zero.stage=1 > "$WORK/s1.log" 2>&1
rc=$?
set -e
[[ $rc == 0 ]] || fail "stage 1 with reduce_per_micro_batch: true in a run's config.yaml: exit $rc: $(tail -3 "$WORK/s1.log")"
echo PASS
