#!/usr/bin/env bash
# zero stage 3 (parameters sharded, gathered per block): bitwise equal to
# stage 1 at the same layout (losses of 20 steps, grad norms, eval losses,
# every gradient of step 1) at dp=2, dp=4, tp=2 x dp=2, pp=2 x dp=2, ep=2
# (MoE) on 2 processes and on 4 (edp=2: experts sharded too), with
# recompute, with tied embeddings, without resharding after forward and
# without prefetch; after each step a rank holds 1/dp of the
# sharded parameters' bytes, and at most a few blocks' parameters are
# whole at once during a step (the current block and the one prefetched:
# less than all of them); with prefetch 1 the next block's gather is in
# flight before its block asks for it, with prefetch 0 never. Checkpoints: a stage-3 dp=2 checkpoint resumes
# at stage 3 bitwise, at dp=4 stage 3 and at dp=1 without zero within the
# bars; a plain checkpoint resumes under stage 3 at dp=2.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
# Reduced once per step (reduce_per_micro_batch: false): the sums of stage
# 1, so stage 3's numbers are stage 1's bitwise.
common=(--set training.dump_grads_at_step=1 --set features.zero.enabled=true --set features.zero.reduce_per_micro_batch=false)
moe=(--set model.moe.num_experts=4 --set model.moe.top_k=2)
run() {  # NAME NPROC STAGE ARGS...
  local name=$1 n=$2 st=$3; shift 3
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${common[@]}" --set features.zero.stage="$st" "$@" \
    --set run.output_dir="$WORK/$name" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "$name run"; }
}
same() {  # NAME NPROC REF ARGS...: stage 3 against stage 1 (REF's stage-1 run, or its own when REF is -), bitwise
  local name=$1 n=$2 ref=$3; shift 3
  if [[ $ref == - ]]; then ref=$name; run "${ref}_s1" "$n" 1 "$@"; fi
  run "${name}_s3" "$n" 3 "$@"
  echo "== $name: stage 3 against stage 1 ($ref)"
  "$BIN/hp-compare" "$WORK/${ref}_s1" "$WORK/${name}_s3" --exact --grads-step 1 --grad-rtol 0 \
    --phase "zero stage 3's per-block gathers" || fail "$name: stage 3 differs from stage 1"
  python3 - "$WORK/${ref}_s1" "$WORK/${name}_s3" "$name" <<'PY' || fail "$name: parameter bytes"
import json, sys
def last(d):
    return [j for j in map(json.loads, open(d + "/metrics.jsonl")) if "zero_param_bytes" in j][-1]
a, b = last(sys.argv[1]), last(sys.argv[2])
print(f"-- {sys.argv[3]}: rank 0 holds {b['zero_param_bytes']:.0f} parameter bytes after a step at stage 3, "
      f"{a['zero_param_bytes']:.0f} at stage 1; {b['zero_block_gathers']:.0f} block gathers per step, "
      f"{b['zero_block_gathers_prefetched']:.0f} of them prefetched; at most {b['zero_gathered_peak_bytes']:.0f} "
      f"of {b['zero_sharded_param_bytes']:.0f} sharded parameter bytes whole at once")
sys.exit(0 if b["zero_param_bytes"] < a["zero_param_bytes"] and b["zero_block_gathers"] > 0 else 1)
PY
}
# dp2's runs also save at step 10: the stage-3 one is the checkpoint the
# resumes below start from (saving leaves the numbers alone).
same dp2 2 - --set checkpoint.interval=10
same dp4 4 -
same tp2dp2 4 - --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
same pp2dp2 4 - --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
same ep2 2 - "${moe[@]}" --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2
# ep=2 over 4 processes: edp has two members, so the experts' units are
# sharded and gathered over edp beside the dense units over dp.
same ep2edp2 4 - "${moe[@]}" --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2
same tied 2 - --set model.tie_embeddings=true
# Recompute, overlap and these two options leave the numbers alone (zero
# with recompute is bitwise zero without: level1.zero.parity; overlap on is
# bitwise off: level1.training.overlap), so dp2's stage-1 run is their reference.
same rc 2 dp2 --set features.recompute.enabled=true
same keep 2 dp2 --set features.zero.reshard_after_forward=false --set features.zero.prefetch=0
same overlap 2 dp2 --set distributed.overlap=true --set distributed.bucket_size_mb=0.004
figure() {  # RUN KEY: the last step's figure
  python3 -c 'import json,sys
print(int([j for j in map(json.loads, open(sys.argv[1]+"/metrics.jsonl")) if sys.argv[2] in j][-1][sys.argv[2]]))' "$WORK/$1" "$2"
}
(( $(figure dp2_s3 zero_block_gathers_prefetched) > 0 )) || fail "dp2: no gather was prefetched"
(( $(figure keep_s3 zero_block_gathers_prefetched) == 0 )) || fail "prefetch 0: a gather was prefetched"
replayed_every_step "$WORK/rc_s3" || fail "recompute did not run under stage 3"
(( $(figure dp2_s3 zero_gathered_peak_bytes) < $(figure dp2_s3 zero_sharded_param_bytes) )) \
  || fail "dp2: every parameter was whole at once during a step"
# At dp=2 a rank holds half of every sharded parameter (all of them here).
python3 - "$WORK/dp2_s1" "$WORK/dp2_s3" <<'PY' || fail "dp2: not half the parameter bytes"
import json, sys
def last(d):
    return [j for j in map(json.loads, open(d + "/metrics.jsonl")) if "zero_param_bytes" in j][-1]["zero_param_bytes"]
sys.exit(0 if abs(last(sys.argv[2]) / last(sys.argv[1]) - 0.5) <= 0.01 else 1)
PY
echo "== checkpoints"
ck="$WORK/dp2_s3/checkpoints/step_00000010"
[[ -d "$ck" ]] || fail "no step-10 checkpoint"
run again 2 3 --set checkpoint.resume="$ck"
"$BIN/hp-compare" "$WORK/dp2_s3" "$WORK/again" --from-step 11 --exact --phase "stage 3 resumed at stage 3" \
  || fail "stage 3 -> stage 3 not bitwise"
run at4 4 3 --set checkpoint.resume="$ck"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 1 --set checkpoint.resume="$ck" --set run.output_dir="$WORK/off" \
  > "$WORK/off.log" 2>&1 || { tail -20 "$WORK/off.log"; fail "resume without zero"; }
for r in at4 off; do
  "$BIN/hp-compare" "$WORK/dp2_s3" "$WORK/$r" --from-step 11 --first-loss-rtol 1e-4 --loss-rtol 1e-4 --phase "resume of stage 3" \
    || fail "$r resumed from stage 3"
done
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set checkpoint.interval=10 --set run.output_dir="$WORK/plain" \
  > "$WORK/plain.log" 2>&1 || fail "plain run"
run fromplain 2 3 --set checkpoint.resume="$WORK/plain/checkpoints/step_00000010"
"$BIN/hp-compare" "$WORK/plain" "$WORK/fromplain" --from-step 11 --first-loss-rtol 1e-6 --loss-rtol 1e-6 --norm-rtol 1e-6 \
  --phase "plain resumed under stage 3" || fail "plain -> stage 3"
echo PASS
