#!/usr/bin/env bash
# hp-compare on hand-made run directories: it passes equal runs, and fails
# (exit 1) when it compared no gradients or a gradient is on one side only.
set -uo pipefail
HP_COMPARE=$1
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# make_run DIR NAME...: metrics.jsonl with two steps, and a step-1 gradient
# dump holding a [2] float32 tensor per NAME (safetensors: 8-byte header
# length, JSON header, raw bytes).
make_run() {
  local d=$1; shift
  mkdir -p "$d/grads_step1"
  printf '{"step":1,"loss":2.5}\n{"step":2,"loss":2.0}\n' > "$d/metrics.jsonl"
  python3 - "$d/grads_step1/grads-rank00000.safetensors" "$@" <<'PY'
import json, struct, sys
names = sys.argv[2:]
header, data = {}, b""
for n in names:
    header[n] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
    data += struct.pack("<2f", 1.0, -2.0)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
}
make_run "$dir/ref" a b
make_run "$dir/same" a b
make_run "$dir/extra" a b c
make_run "$dir/none"
out=$("$HP_COMPARE" "$dir/ref" "$dir/same" --grads-step 1 2>&1) || fail "equal runs: $out"
grep -q "compared 2 gradients of step 1" <<<"$out" || fail "$out"
out=$("$HP_COMPARE" "$dir/ref" "$dir/extra" --grads-step 1 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "a gradient only in the run passed (exit $rc): $out"
grep -q "gradient c missing from the reference" <<<"$out" || fail "$out"
out=$("$HP_COMPARE" "$dir/extra" "$dir/ref" --grads-step 1 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "a gradient only in the reference passed (exit $rc): $out"
grep -q "gradient c missing from the run" <<<"$out" || fail "$out"
out=$("$HP_COMPARE" "$dir/none" "$dir/none" --grads-step 1 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "no gradients compared passed (exit $rc): $out"
grep -q "FAIL: no gradients to compare" <<<"$out" || fail "$out"
echo PASS
