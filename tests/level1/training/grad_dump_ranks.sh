#!/usr/bin/env bash
# Gradient dumps from every rank: a 2-step run of one process against tp=2
# and against dp=2 with zero. Every rank writes its own slices; hp-compare
# assembles them, checks that the copies of the parameters tp does not split
# (layernorms, biases after a row-parallel layer) are bitwise equal on both
# tp ranks, and compares with the one-process dump. A copy changed by one
# bit on tp rank 1 then fails, naming the gradient and the two ranks.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.max_steps=2 --set training.dump_grads_at_step=1)
run() {  # NAME ARGS...
  local name=$1; shift
  "$BIN/hp-train" "$WORK/c.yaml" "${common[@]}" --set run.output_dir="$WORK/$name" "$@" > "$WORK/log" 2>&1 \
    || { cat "$WORK/log"; fail "$name run failed"; }
}
run ref
run tp2 --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
run z2 --nproc 2 --set features.zero.enabled=true
for r in tp2 z2; do
  [[ -f $WORK/$r/grads_step1/grads-rank00001.safetensors ]] || fail "$r: rank 1 wrote no gradient dump"
done
echo "== tp=2 against one process"
out=$("$BIN/hp-compare" "$WORK/ref" "$WORK/tp2" --grads-step 1) || { echo "$out"; fail "tp=2 parity"; }
echo "$out" | tail -4
# 15 gradients are whole on both tp ranks: the position embedding, the four
# layernorm tensors and the two row-parallel biases of each block, the
# final layernorm's two.
grep -q "run: 2 files, 58 slices assembled into 29 gradients; 15 replica copies checked bitwise equal" <<<"$out" \
  || fail "the tp=2 dump's replicated copies were not all checked: $out"
echo "== dp=2 with zero against one process"
out=$("$BIN/hp-compare" "$WORK/ref" "$WORK/z2" --grads-step 1) || { echo "$out"; fail "zero parity"; }
echo "$out" | tail -4
grep -q "run: 2 files, 58 slices assembled into 29 gradients" <<<"$out" || fail "zero's slices: $out"
echo "== tp rank 1's copy of blocks.0.ln1.weight changed by one bit"
cp -r "$WORK/tp2" "$WORK/tp2bad"
python3 - "$WORK/tp2bad/grads_step1/grads-rank00001.safetensors" <<'PY' || fail "could not edit the dump"
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
e = json.loads(b[8:8 + n])["blocks.0.ln1.weight"]
b[8 + n + e["data_offsets"][0]] ^= 1
open(sys.argv[1], "wb").write(b)
PY
out=$("$BIN/hp-compare" "$WORK/ref" "$WORK/tp2bad" --grads-step 1); rc=$?
[[ $rc -eq 1 ]] || fail "a changed replica passed (exit $rc): $out"
grep -q "FAIL: gradient blocks.0.ln1.weight of step 1 slice at \[0\] of shape \[64\]: the replicas on rank 0 and rank 1 differ in the run" <<<"$out" \
  || fail "$out"
echo PASS
