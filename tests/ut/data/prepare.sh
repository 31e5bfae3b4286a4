#!/bin/bash
# hp-data prepare: an interrupted prepare (stopped after some shards, and a
# shard left half-written as a crash leaves it) finishes to the same bytes
# as an uninterrupted one, with one and with two threads; a finished shard
# is never rewritten; JSON Lines; inspect; and hp-train's refusals of a
# damaged corpus, a missing shard, another tokenizer, a small vocabulary.
# Usage: prepare.sh BIN_DIR
set -euo pipefail
BIN=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
IN=/usr/share/games/fortunes/computers
"$BIN/hp-data" train-tokenizer --input "$IN" --vocab-size 500 --out "$W/sp.model" --threads 1 > /dev/null

prep() { "$BIN/hp-data" prepare --input "$IN" --tokenizer "$W/sp.model" --split-on % --shard-mb 0.04 "$@"; }
prep --out "$W/full" --threads 1 > "$W/full.log" 2>&1 || { cat "$W/full.log"; fail "prepare"; }
shards=$(ls "$W/full"/shard-*.bin | wc -l)
[ "$shards" -ge 5 ] || fail "expected at least 5 shards, got $shards"
grep -q "prepare \[#*\] 100.0%" "$W/full.log" || { cat "$W/full.log"; fail "no progress bar"; }
grep -q "MB/s" "$W/full.log" || fail "no rate"

# Interrupted: 2 shards, then a crash's leftover temporary file, then the rest.
prep --out "$W/part" --threads 2 --stop-after-shards 2 > "$W/part1.log" 2>&1
grep -q "run the same command again to continue" "$W/part1.log" || { cat "$W/part1.log"; fail "no stop note"; }
[ ! -e "$W/part/manifest.json" ] || fail "a manifest before every shard is finished"
done_before=$(ls "$W/part"/shard-*.json | wc -l)
[ "$done_before" -eq 2 ] || fail "$done_before shards finished after --stop-after-shards 2"
first=$(ls "$W/part"/shard-*.json | head -1); first_bin=${first%.json}.bin
stamp=$(stat -c %.9Y.%i "$first_bin")
next=$(printf '%s/shard-%05d' "$W/part" "$done_before")
head -c 1000 /dev/urandom > "$next.bin.tmp"   # a crash mid-write
head -c 10 /dev/urandom > "$next.bin"          # and a torn file without its .json
prep --out "$W/part" --threads 2 > "$W/part2.log" 2>&1 || { cat "$W/part2.log"; fail "continue"; }
grep -q "continuing: 2 of $shards shards already finished" "$W/part2.log" || { cat "$W/part2.log"; fail "no continue note"; }
[ "$(stat -c %.9Y.%i "$first_bin")" = "$stamp" ] || fail "a finished shard was rewritten"
for f in "$W/full"/shard-* "$W/full/manifest.json"; do
  cmp -s "$f" "$W/part/$(basename "$f")" || fail "$(basename "$f") differs between the interrupted and the whole prepare"
done
echo "ok: interrupted (2 threads) and uninterrupted (1 thread) prepares are byte-identical ($shards shards)"

# Another tokenizer into the same directory is refused (exit 2).
if "$BIN/hp-data" prepare --input "$IN" --tokenizer bytes --split-on % --shard-mb 0.04 --out "$W/part" > "$W/o" 2>&1; then
  fail "a prepare of other options into a used directory was accepted"
fi
grep -q "plan.json differs" "$W/o" || { cat "$W/o"; fail "refusal text"; }

# JSON Lines with a named field; the end-of-document token after each.
printf '%s\n' '{"body": "first document", "id": 1}' '{"body": "second, with üñíçødé and 東京", "id": 2}' '' \
  '{"body": "third", "id": 3}' > "$W/docs.jsonl"
"$BIN/hp-data" prepare --input "$W/docs.jsonl" --tokenizer "$W/sp.model" --text-field body --out "$W/jl" > /dev/null 2>&1
"$BIN/hp-data" inspect "$W/jl" --samples 3 > "$W/jl.txt"
grep -q "3 documents" "$W/jl.txt" || { cat "$W/jl.txt"; fail "jsonl document count"; }
grep -q "second, with üñíçødé and 東京" "$W/jl.txt" || { cat "$W/jl.txt"; fail "jsonl decode"; }
grep -q "end of document 1" "$W/jl.txt" || fail "eos id"
grep -q "^special     <unk> 0, </s> 1" "$W/jl.txt" || { cat "$W/jl.txt"; fail "special tokens"; }
usage() {  # usage TEXT ARGS...: hp-data refuses (exit 2) with TEXT in one line
  local text=$1 rc=0; shift
  "$BIN/hp-data" "$@" > "$W/o" 2>&1 || rc=$?
  [ $rc -eq 2 ] || { cat "$W/o"; fail "expected exit 2, got $rc ($*)"; }
  grep -qF -- "$text" "$W/o" && [ "$(wc -l < "$W/o")" -eq 1 ] || { cat "$W/o"; fail "the refusal lacks '$text'"; }
  echo "ok: refused: $(cat "$W/o")"
}
usage "--input $W/nowhere: does not exist" prepare --input "$W/nowhere" --tokenizer bytes --out "$W/x1"
usage "--shard-mb 0.000000: must be > 0" prepare --input "$IN" --tokenizer bytes --out "$W/x2" --shard-mb 0
mkdir -p "$W/bin_only" && head -c 100 /dev/zero > "$W/bin_only/zeros"
usage "--input: no text or JSON Lines files found" prepare --input "$W/bin_only" --tokenizer bytes --out "$W/x3"
printf '%s\n' '{"text": "fine"}' 'not json' > "$W/notjson.jsonl"
if "$BIN/hp-data" prepare --input "$W/notjson.jsonl" --tokenizer bytes --out "$W/x4" > "$W/o" 2>&1; then
  fail "a line that is not JSON was accepted"
fi
grep -q "notjson.jsonl (line 2 after byte 0): not JSON" "$W/o" || { cat "$W/o"; fail "not-JSON refusal text"; }
printf '%s\n' '{"text": "no body"}' > "$W/bad.jsonl"
if "$BIN/hp-data" prepare --input "$W/bad.jsonl" --tokenizer "$W/sp.model" --text-field body --out "$W/jb" > "$W/o" 2>&1; then
  fail "a JSON line without the field was accepted"
fi
grep -q "no string field 'body'" "$W/o" || { cat "$W/o"; fail "jsonl refusal text"; }
echo "ok: JSON Lines, inspect"

# hp-train refuses a damaged or foreign corpus before start (exit 2).
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: 1, hidden: 32, heads: 2, seq_len: 16}
data: {type: tokens, path: $W/full}
training: {max_steps: 1, global_batch_size: 2, micro_batch_size: 2}
YAML
refused() {  # refused TEXT ARGS...
  local text=$1 rc=0; shift
  "$BIN/hp-train" "$W/c.yaml" --dry-run "$@" > "$W/o" 2>&1 || rc=$?
  [ $rc -eq 2 ] || { cat "$W/o"; fail "expected exit 2, got $rc ($*)"; }
  grep -qF -- "$text" "$W/o" || { cat "$W/o"; fail "the refusal lacks '$text'"; }
  echo "ok: refused: $(grep -F -- "$text" "$W/o" | head -1)"
}
"$BIN/hp-train" "$W/c.yaml" --dry-run > "$W/o" 2>&1 || { cat "$W/o"; fail "dry run of a sound corpus"; }
grep -q "vocab_size: 500" "$W/o" || fail "model.vocab_size did not follow the tokenizer"
refused "is below the tokenizer's vocabulary of 500" --set model.vocab_size=300
"$BIN/hp-data" train-tokenizer --input "$IN" --vocab-size 450 --out "$W/other.model" --threads 1 > /dev/null
refused "but the shards of $W/full were made with sentencepiece:" --set data.tokenizer="$W/other.model"
cp -r "$W/full" "$W/damaged"
printf 'x' | dd of="$W/damaged/shard-00001.bin" bs=1 seek=7 conv=notrunc 2> /dev/null
refused "shard $W/damaged/shard-00001.bin is damaged: its xxh64 differs" --set data.path="$W/damaged"
rm "$W/damaged/shard-00002.idx"
refused "shard $W/damaged/shard-00002.idx is missing" --set data.path="$W/damaged"
refused "is not a prepared corpus: it has no manifest.json" --set data.path="$W"
"$BIN/hp-data" prepare --input "$IN" --tokenizer bytes --split-on % --out "$W/bytes" > /dev/null 2>&1
refused "was tokenized with bytes:" --set 'data.blend=[{path: '"$W/full"', weight: 1}, {path: '"$W/bytes"', weight: 1}]'
refused "weight must be a finite number > 0" --set 'data.blend=[{path: '"$W/full"', weight: 0}]'
refused "unknown key 'wieght' (path, weight)" --set 'data.blend=[{path: '"$W/full"', wieght: 1}]'
refused "item 0 has no path" --set 'data.blend=[{weight: 1}]'
cp -r "$W/full" "$W/v2" && sed -i 's/"version": 1/"version": 2/' "$W/v2/manifest.json"
refused "version 2 is not the one this build reads (1)" --set data.path="$W/v2"
refused "data.type text has no documents to keep attention inside" --set data.type=text --set data.document_attention=true
refused "model 'mlp' has no attention" --set model.type=mlp --set data.document_attention=true
echo PASS
