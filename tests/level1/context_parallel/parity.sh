#!/usr/bin/env bash
# docs/PARITY.md for context parallel, against one process (first-step loss
# and every gradient within 1e-5; 20-step losses, grad norms and eval losses
# within 1e-4), dropout 0.1 (masks by global position): cp=2, cp=4;
# cp=2 x dp=2 with zero; cp=2 x tp=2 with sequence parallel; cp=2 x pp=2
# (and with schedule zbv, bitwise to 1f1b's);
# cp=2 with selective recompute bitwise equal to cp=2 without.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1 --set model.vocab_size=66)
"$BIN/hp-train" "$WORK/c.yaml" "${common[@]}" --set run.output_dir="$WORK/ref" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "reference"; }
run() {  # name nproc cp mesh-line [extra args]
  local name=$1 nproc=$2 c=$3 mesh=$4
  shift 4
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$nproc" "${common[@]}" --set features.context_parallel.enabled=true \
    --set features.context_parallel.size="$c" --set run.output_dir="$WORK/$name" "$@" > "$WORK/log" 2>&1 \
    || { cat "$WORK/log"; fail "$name run"; }
  grep -q "mesh $mesh over" "$WORK/log" || fail "$name: wrong mesh (want $mesh)"
  echo "== $name against one process"
  "$BIN/hp-compare" "$WORK/ref" "$WORK/$name" --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --eval-rtol 1e-5 \
    --grad-rtol 1e-5 --phase "context-parallel optimizer steps" || fail "$name parity"
}
run cp2 2 2 "dp=1 cp=2" --set run.profile.enabled=true --set "run.profile.steps=[2,3]"
# The ring's steps are trace spans on both ranks, beside its point-to-point
# messages on the cp group (the profile does not change the numbers: cp2rc
# below is held bitwise to this run).
python3 - "$WORK/cp2/trace.json" "$(dirname "$0")/../profile" <<'PY' || fail "ring spans missing from the trace"
import sys
sys.path.insert(0, sys.argv[2])
from check_trace import load
spans = load(sys.argv[1])
assert sorted(spans) == [0, 1], sorted(spans)
for rank, events in spans.items():
    names = {e["name"] for e in events}
    for want in ("ring_attention_step", "ring_attention_backward_step", "ring_wait"):
        assert want in names, (rank, want)
    steps = sorted({e["args"]["ring_step"] for e in events if e["name"] == "ring_attention_step"})
    assert steps == [0, 1], (rank, steps)
    p2p = [e for e in events if e["cat"] == "comm" and e["args"].get("group") == "cp" and e["name"].startswith(("send", "recv"))]
    assert p2p, (rank, "no send or recv on group cp")
print("trace: ring steps 0 and 1, forward and backward, ring waits and cp sends/receives on both ranks")
PY
run cp4 4 4 "dp=1 cp=4"
run cp2dp2zero 4 2 "dp=2 cp=2" --set features.zero.enabled=true
run cp2tp2sp 4 2 "dp=1 cp=2 tp=2" --set features.tensor_parallel.enabled=true \
  --set features.tensor_parallel.sequence_parallel=true
run cp2pp2 4 2 "pp=2 dp=1 cp=2" --set features.pipeline_parallel.enabled=true
run cp2pp2zbv 4 2 "pp=2 dp=1 cp=2" --set features.pipeline_parallel.enabled=true \
  --set features.pipeline_parallel.schedule=zbv
echo "== cp2pp2 with zbv (B and W apart, chunks in a V) against cp2pp2 (1f1b), bitwise"
"$BIN/hp-compare" "$WORK/cp2pp2" "$WORK/cp2pp2zbv" --exact --norm-rtol 1e-14 --grads-step 1 --grad-rtol 0 \
  --phase "zbv with context parallel" | tail -2 || fail "cp x zbv"
run cp2rc 2 2 "dp=1 cp=2" --set features.recompute.enabled=true --set features.recompute.granularity=selective
replayed_every_step "$WORK/cp2rc" || fail "selective recompute did not run under cp"
echo "== cp2 + selective recompute against cp2"
"$BIN/hp-compare" "$WORK/cp2" "$WORK/cp2rc" --exact --grads-step 1 --grad-rtol 0 --phase recompute || fail "cp x recompute"
echo PASS
