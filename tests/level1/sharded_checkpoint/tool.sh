#!/usr/bin/env bash
# hp-ckpt on a real sharded checkpoint: verify and inspect it; convert it
# offline to tp=4 and to one process, and each resume gives bitwise the
# losses of the online re-shard (resuming from the original at that
# layout); consolidate it to one safetensors file, import that file as a
# step-0 checkpoint, and a run started from it begins at the trained loss.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
steps=(--set training.max_steps=30)
sharded=(--set features.sharded_checkpoint.enabled=true)
tp() { echo --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size="$1"; }
run() {
  local name=$1 n=$2; shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${steps[@]}" "$@" --set run.output_dir="$WORK/$name" \
    > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "run $name"; }
}
# shellcheck disable=SC2046
run a 2 $(tp 2) "${sharded[@]}" --set checkpoint.interval=20
ck="$WORK/a/checkpoints/step_00000020"
"$BIN/hp-ckpt" verify "$ck" || fail "verify refused a good checkpoint"
"$BIN/hp-ckpt" inspect "$ck" > "$WORK/inspect.txt" || fail "inspect"
grep -q "blocks.0.attn.qkv.weight" "$WORK/inspect.txt" && grep -q "tp" "$WORK/inspect.txt" \
  || { cat "$WORK/inspect.txt"; fail "inspect does not show the tp-split attention weight"; }

echo "== a flipped byte in manifest.json: refused by verify and by a resume, in one line naming the file"
cp -r "$ck" "$WORK/bad"
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x27; open(p, "wb").write(b)' \
  "$WORK/bad/manifest.json"
"$BIN/hp-ckpt" verify "$WORK/bad" 2> "$WORK/verify.err" && fail "verify accepted a damaged manifest"
[[ $(wc -l < "$WORK/verify.err") -eq 1 ]] || { cat "$WORK/verify.err"; fail "verify: not one line"; }
grep -q "bad manifest $WORK/bad/manifest.json: its xxh64 is .*; resume from another step" "$WORK/verify.err" \
  || { cat "$WORK/verify.err"; fail "verify does not name the manifest and the fix"; }
# shellcheck disable=SC2046
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 $(tp 2) "${sharded[@]}" "${steps[@]}" --set checkpoint.resume="$WORK/bad" \
  --set run.output_dir="$WORK/bad_run" > "$WORK/bad_run.log" 2>&1 && fail "a resume from a damaged manifest started"
line=$(grep -m1 "bad manifest $WORK/bad/manifest.json" "$WORK/bad_run.log") \
  || { tail -5 "$WORK/bad_run.log"; fail "the resume does not name the damaged manifest"; }
grep -q "resume from another step" <<<"$line" || fail "no fix in: $line"
echo "resume refused: ${line:0:200}"

echo "== offline convert to tp=4 and to one process, against the online re-shard"
"$BIN/hp-ckpt" convert "$ck" --to "$WORK/c4" --tp 4 || fail "convert --tp 4"
"$BIN/hp-ckpt" convert "$ck" --to "$WORK/c1" || fail "convert to one process"
"$BIN/hp-ckpt" verify "$WORK/c4" && "$BIN/hp-ckpt" verify "$WORK/c1" || fail "a converted checkpoint does not verify"
# shellcheck disable=SC2046
run online4 4 $(tp 4) --set checkpoint.resume="$ck"
# shellcheck disable=SC2046
run offline4 4 $(tp 4) --set checkpoint.resume="$WORK/c4"
run online1 1 --set checkpoint.resume="$ck"
run offline1 1 --set checkpoint.resume="$WORK/c1"
"$BIN/hp-compare" "$WORK/online4" "$WORK/offline4" --exact --phase "offline convert to tp=4" || fail "tp=4"
"$BIN/hp-compare" "$WORK/online1" "$WORK/offline1" --exact --phase "offline convert to one process" || fail "tp=1"

echo "== consolidate, import, start from the imported weights"
"$BIN/hp-ckpt" convert "$ck" --to "$WORK/flat" --consolidate || fail "consolidate"
[[ -s "$WORK/flat/model.safetensors" ]] || fail "no consolidated model.safetensors"
"$BIN/hp-ckpt" import "$WORK/flat/model.safetensors" --to "$WORK/imported" || fail "import"
# shellcheck disable=SC2046
run from_import 2 $(tp 2) --set checkpoint.resume="$WORK/imported" --set training.max_steps=2
grep -q "resumed from .* at step 0" "$WORK/from_import.log" || fail "the run did not start from the imported step 0"
python3 - "$WORK/a" "$WORK/from_import" <<'PY' || fail "the imported weights were not loaded"
import json, sys
rows = lambda d: [json.loads(l) for l in open(d + "/metrics.jsonl") if l.strip()]
fresh, imported = rows(sys.argv[1])[0]["loss"], rows(sys.argv[2])[0]["loss"]
trained = rows(sys.argv[1])[19]["loss"]
print(f"first loss: fresh weights {fresh:.4f}, imported step-20 weights {imported:.4f} (step 20 of the run: {trained:.4f})")
assert imported < 0.5 * fresh, "the imported run starts at the loss of fresh weights"
PY
echo PASS
