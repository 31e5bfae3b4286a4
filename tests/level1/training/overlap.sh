#!/usr/bin/env bash
# Gradient reduction overlapped with backward (distributed.overlap) against
# the blocking path, bitwise, and the same bytes per step per group and
# operation (metrics.jsonl comm_bytes_*): losses of every step and the gradients of
# step 2 (step 1 counts each parameter's gradients and reduces after
# backward; from step 2 buckets launch from the accumulator hooks). Small
# buckets (4 KiB) so the model makes many. Layouts: dp=2, tp=2 x dp=2,
# dp=2 with zero, ep=2 (MoE), pp=2 x dp=2 (1F1B). Each overlapped run must
# show buckets launched during backward (grad_buckets_early > 0 from step
# 2), each blocking run none.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
# The buckets keep their declared order here (distributed.rebuild_buckets:
# false): its check after the first step is communication overlap alone
# would not add; the rebuild is compared on its own at the end.
common=(--set training.max_steps=3 --set training.eval_interval=0 --set training.dump_grads_at_step=2
        --set distributed.bucket_size_mb=0.004 --set metrics.peak_flops=1e10 --set distributed.rebuild_buckets=false)
moe=(--set model.moe.num_experts=4 --set model.moe.top_k=2)
run() {  # NAME NPROC OVERLAP ARGS...
  local name=$1 n=$2 ov=$3; shift 3
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${common[@]}" --set distributed.overlap="$ov" "$@" \
    --set run.output_dir="$WORK/$name" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "$name run"; }
}
early() {  # RUN_DIR STEP: grad_buckets_early of that step ("" when absent)
  python3 -c 'import json,sys
for l in open(sys.argv[1]+"/metrics.jsonl"):
    j=json.loads(l)
    if j.get("step")==int(sys.argv[2]): print(int(j.get("grad_buckets_early",-1)), int(j.get("grad_buckets",-1))); break' "$1" "$2"
}
check() {  # NAME NPROC EXPECT_EARLY(yes|no) ARGS...
  local name=$1 n=$2 want=$3; shift 3
  run "${name}_on" "$n" true "$@"
  run "${name}_off" "$n" false "$@"
  echo "== $name: overlap on vs off"
  "$BIN/hp-compare" "$WORK/${name}_off" "$WORK/${name}_on" --exact --grads-step 2 --phase "overlapped gradient reduction" \
    || fail "$name: overlap changed the numbers"
  python3 - "$WORK/${name}_off" "$WORK/${name}_on" <<'PY' || fail "$name: overlap changed the bytes sent per step"
import json, sys
def steps(d):
    return {j["step"]: {k: v for k, v in j.items() if k.startswith("comm_bytes")}
            for j in map(json.loads, open(d + "/metrics.jsonl")) if "step" in j and "loss" in j}
off, on = steps(sys.argv[1]), steps(sys.argv[2])
# zero's parameter all-gathers after the update travel eight buckets ahead of
# the blocks that read them (overlap on): the rest of step s's are issued,
# and counted, in step s + 1's forward. Those series (and the total) are
# held cumulatively: never more than the blocking run's, at most one step
# behind it; every other series equal step by step.
late = lambda k: k.endswith("_all_gather") or k == "comm_bytes"
for s in sorted(off):
    keys = set(off[s]) | set(on.get(s, {}))
    diff = sorted(k for k in keys if not late(k) and off[s].get(k) != on.get(s, {}).get(k))
    if diff:
        sys.exit(f"step {s}: bytes per group and op differ: {diff[:4]}")
    for k in filter(late, keys):
        got = sum(on[t].get(k, 0) for t in on if t <= s)
        upto = sum(off[t].get(k, 0) for t in off if t <= s)
        before = sum(off[t].get(k, 0) for t in off if t < s)
        if not before <= got <= upto:
            sys.exit(f"step {s}: {k}: {got:.0f} bytes sent through step {s}, the blocking run {upto:.0f} ({before:.0f} a step before)")
print(f"-- bytes per step per group and op equal at steps {sorted(off)} ({len(off[max(off)])} series; all-gathers at most a step late)")
PY
  read -r e_on total < <(early "$WORK/${name}_on" 2)
  read -r e_off _ < <(early "$WORK/${name}_off" 2)
  if [[ $want == no ]]; then
    echo "-- $name: its reducer reports no buckets (it does not overlap): bitwise equal is all there is to check"
    [[ $e_on == -1 && $e_off == -1 ]] || fail "$name: expected no bucket figures, got $e_on and $e_off"
    return
  fi
  echo "-- $name: step 2: $e_on of $total buckets launched during backward (overlap on), $e_off (off)"
  [[ $e_off == 0 ]] || fail "$name: the blocking run launched $e_off buckets during backward"
  if [[ $want == yes ]]; then
    [[ $total -gt 1 ]] || fail "$name: $total buckets; the test needs several"
    [[ $e_on -gt 0 ]] || fail "$name: no bucket was launched during backward with overlap on"
  fi
}
check dp2 2 yes
check tp2dp2 4 yes --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
check ep2 2 yes "${moe[@]}" --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2
check pp2dp2 4 yes --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
check zero2 2 yes --set features.zero.enabled=true
# zero's parameter all-gathers: issued after the update, each waited by the
# first block that reads it in the next forward (overlap on); waited inside
# the update (off). Also under recompute (the observer sits inside its wrapper).
gathers() {  # RUN_DIR STEP: zero_gathers_in_forward zero_gathers of that step
  python3 -c 'import json,sys
for l in open(sys.argv[1]+"/metrics.jsonl"):
    j=json.loads(l)
    if j.get("step")==int(sys.argv[2]): print(int(j.get("zero_gathers_in_forward",-1)), int(j.get("zero_gathers",-1))); break' "$1" "$2"
}
check zero2rc 2 yes --set features.zero.enabled=true --set features.recompute.enabled=true
for name in zero2 zero2rc; do
  read -r f_on g_on < <(gathers "$WORK/${name}_on" 2)
  read -r f_off _ < <(gathers "$WORK/${name}_off" 2)
  echo "-- $name: step 2: $f_on of $g_on parameter gathers waited in forward (overlap on), $f_off (off)"
  [[ $g_on -gt 1 ]] || fail "$name: $g_on parameter gathers; the test needs several"
  [[ $f_on == "$g_on" ]] || fail "$name: overlap on: $f_on of $g_on gathers were waited in forward"
  [[ $f_off == 0 ]] || fail "$name: overlap off: $f_off gathers waited in forward"
done
# The buckets rebuilt in arrival order after step 1 (distributed.rebuild_buckets)
# against the declared order, overlap on, dp=2 with tied embeddings (the
# shared weight's first gradient comes from the head, early in backward,
# far from its declared place): bitwise the same numbers, and from step 3
# the same bytes per group and operation (the replicas' check that they cut
# the same buckets, a few integers, runs between steps 1 and 2).
tie=(--set model.tie_embeddings=true)
run tied_declared 2 true "${tie[@]}"
run tied_rebuilt 2 true "${tie[@]}" --set distributed.rebuild_buckets=true
# hp-train runs on mimalloc with freed memory kept (docs/toolchain.md section 8):
# the rebuild reads counts the old launcher learned, which mimalloc reuses
# once freed (a use-after-free there failed other layouts' runs at step 2).
grep -q "memory: mimalloc [0-9.]*, freed memory kept for the next step" "$WORK/tied_rebuilt.log" \
  || { grep "memory:" "$WORK/tied_rebuilt.log"; fail "hp-train does not name mimalloc on its start line"; }
echo "== dp2, tied embeddings: buckets rebuilt in arrival order vs declared order"
"$BIN/hp-compare" "$WORK/tied_declared" "$WORK/tied_rebuilt" --exact --grads-step 2 --phase "rebuilt gradient buckets" \
  || fail "rebuilt buckets changed the numbers"
python3 - "$WORK/tied_declared" "$WORK/tied_rebuilt" <<'PY' || fail "rebuilt buckets"
import json, sys
def rows(d):
    return {j["step"]: j for j in map(json.loads, open(d + "/metrics.jsonl")) if "step" in j and "loss" in j}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
rebuilt = [b[s].get("grad_buckets_rebuilt") for s in sorted(b)]
if rebuilt[-1] != 1 or "grad_buckets_rebuilt" in a[max(a)]:
    sys.exit(f"grad_buckets_rebuilt: {rebuilt} with rebuild_buckets, {a[max(a)].get('grad_buckets_rebuilt')} without")
extra = 0
for s in sorted(a):
    ca = {k: v for k, v in a[s].items() if k.startswith("comm_bytes")}
    cb = {k: v for k, v in b[s].items() if k.startswith("comm_bytes")}
    diff = {k: cb.get(k, 0) - ca.get(k, 0) for k in set(ca) | set(cb) if ca.get(k, 0) != cb.get(k, 0)}
    # The replicas' check (a few integers) runs once, between steps 1 and 2.
    if diff and (s > 2 or any(not 0 < v <= 64 for k, v in diff.items() if k != "comm_bytes")):
        sys.exit(f"step {s}: bytes differ: {diff}")
    extra += diff.get("comm_bytes", 0)
print(f"-- rebuilt after step 1 ({rebuilt}); step 2: {b[2]['grad_buckets_early']:.0f} of {b[2]['grad_buckets']:.0f} "
      f"buckets launched during backward (declared order: {a[2]['grad_buckets_early']:.0f}); bytes equal from step 3, "
      f"{extra:.0f} bytes of the check before")
PY
echo PASS
