#!/bin/bash
# Tokenizers against a reference written from the published algorithm
# (tests/ut/data/bpe_reference.py, Python's `regex` for \p{L}), on text with
# accents, CJK, emoji, digits, contractions and whitespace runs; round trips
# for byte-level BPE, SentencePiece and bytes; the refusals of a bad file.
# Usage: tokenizers.sh HP_DATA
set -euo pipefail
HP_DATA=$1
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
CORPUS=/usr/share/games/fortunes/computers
TEXTS=$W/texts.jsonl
fail() { echo "FAIL: $*"; exit 1; }
# The hand-written texts, and 40 fortunes the merges were not learned from.
cp "$HERE/texts.jsonl" "$TEXTS"
$PY - "$CORPUS" >> "$TEXTS" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()[210000:]
for f in text.split("\n%\n")[1:41]:
    print(json.dumps({"text": f}))
PY

# A corpus with every kind of text the checks use, so merges cover them.
{ head -c 100000 "$CORPUS"; for _ in $(seq 20); do sed -n 's/.*"text": "\(.*\)"}/\1/p' "$HERE/texts.jsonl"; done; } > "$W/corpus.txt"

# Merges learned once (GPT-2's pattern); the Llama 3 file has the same
# vocabulary and merges as [a, b] pairs behind Llama 3's Split regex.
$PY "$HERE/bpe_reference.py" train "$W/corpus.txt" 600 "$W/gpt2.json" --pattern gpt2
$PY - "$W/gpt2.json" "$W/llama3.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
pattern = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
d["model"]["merges"] = [m.split(" ") for m in d["model"]["merges"]]
json.dump(d, open(sys.argv[2], "w"), ensure_ascii=False)
PY
for name in gpt2 llama3; do
  $PY "$HERE/bpe_reference.py" encode "$W/$name.json" "$TEXTS" > "$W/$name.ref"
  "$HP_DATA" encode --tokenizer "$W/$name.json" --file "$TEXTS" --check-roundtrip > "$W/$name.out"
  "$HP_DATA" encode --tokenizer "$W/$name.json" --file "$TEXTS" --no-cache | cmp -s - "$W/$name.out" \
    || fail "byte-level BPE ($name): the word cache changes the ids"
  if ! diff -u "$W/$name.ref" "$W/$name.out" > "$W/$name.diff"; then
    echo "FAIL: byte-level BPE ($name pattern) differs from the reference:"; head -20 "$W/$name.diff"; exit 1
  fi
  n=$(wc -l < "$W/$name.out")
  [ "$n" -eq "$(grep -c text "$TEXTS")" ] || { echo "FAIL: $n outputs"; exit 1; }
  echo "ok: byte-level BPE ($name pattern) equals the reference on $n texts and round-trips"
done
# The merges did something: fewer tokens than bytes.
tokens=$(head -12 "$W/gpt2.out" | tr -cd ',' | wc -c); bytes=$(wc -c < "$HERE/texts.jsonl")
[ "$tokens" -lt $((bytes / 2)) ] || { echo "FAIL: $tokens tokens for $bytes bytes: merges not applied"; exit 1; }

# SentencePiece: train (byte fallback), round-trip the same texts.
"$HP_DATA" train-tokenizer --input "$W/corpus.txt" --vocab-size 600 --out "$W/sp.model" --threads 1 > "$W/train.log"
grep -q 'vocabulary 600, end of document 1' "$W/train.log" || { cat "$W/train.log"; echo "FAIL: sp training"; exit 1; }
"$HP_DATA" encode --tokenizer "$W/sp.model" --file "$TEXTS" --check-roundtrip > "$W/sp.out"
echo "ok: SentencePiece trained (vocabulary 600) and round-trips every text"
# Its word cache (words cut before each space; a word's ids from the cache
# only when its best segmentation beats the second by more than float
# rounding can reach) gives the library's ids for the whole text: on 400
# fortunes as whole documents (one holds "100044200000;", whose "00000" ties
# 0 00 00 against 00 00 0), runs of spaces, tabs and newlines; and for the
# bpe model kind.
$PY - "$CORPUS" "$W/docs.jsonl" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
with open(sys.argv[2], "w") as out:
    for t in text.split("\n%\n")[:400] + ["  a  b   c", " lead", "trail ", "   ", " ", "a\t b\n  c", "\u3000x y",
                                          "FACILITY REJECTED 100044200000;", "00000 00000 0000000000"]:
        out.write(json.dumps({"text": t}) + "\n")
PY
"$HP_DATA" train-tokenizer --input "$W/corpus.txt" --vocab-size 600 --model-type bpe --out "$W/spb.model" --threads 1 > /dev/null
for tok in sp spb; do
  "$HP_DATA" encode --tokenizer "$W/$tok.model" --file "$W/docs.jsonl" --check-roundtrip > "$W/cached.out"
  "$HP_DATA" encode --tokenizer "$W/$tok.model" --file "$W/docs.jsonl" --no-cache > "$W/uncached.out"
  cmp -s "$W/cached.out" "$W/uncached.out" || { diff "$W/cached.out" "$W/uncached.out" | head -5; fail "SentencePiece ($tok): the word cache changes the ids"; }
  "$HP_DATA" encode --tokenizer "$W/$tok.model" --file "$TEXTS" --check-roundtrip > /dev/null
done
echo "ok: SentencePiece (unigram and bpe): with the word cache = without, on $(wc -l < "$W/docs.jsonl") documents; round trips"
"$HP_DATA" encode --tokenizer bytes --file "$TEXTS" --check-roundtrip > /dev/null
echo "ok: bytes round-trip"

# Refusals: one line naming the file and the reason.
expect_fail() {  # expect_fail PATTERN COMMAND...
  local pat=$1; shift
  if out=$("$@" 2>&1); then echo "FAIL: accepted: $*"; exit 1; fi
  echo "$out" | grep -q -- "$pat" || { echo "FAIL: '$pat' not in: $out"; exit 1; }
  [ "$(echo "$out" | wc -l)" -eq 1 ] || { echo "FAIL: more than one line: $out"; exit 1; }
  echo "ok: refused: $out"
}
echo '{"model": {"type": "Unigram", "vocab": []}}' > "$W/uni.json"
expect_fail "only byte-level BPE" "$HP_DATA" encode --tokenizer "$W/uni.json" --text x
$PY - "$W/gpt2.json" "$W/nfc.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["normalizer"] = {"type": "NFC"}; json.dump(d, open(sys.argv[2], "w"))
PY
expect_fail "normalizer 'NFC' is not supported" "$HP_DATA" encode --tokenizer "$W/nfc.json" --text x
$PY - "$W/gpt2.json" "$W/badmerge.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["model"]["merges"].append("zzzq qqqz"); json.dump(d, open(sys.argv[2], "w"))
PY
expect_fail "names a token not in the vocabulary" "$HP_DATA" encode --tokenizer "$W/badmerge.json" --text x
$PY - "$W/gpt2.json" "$W" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def variant(name, f):
    v = json.loads(json.dumps(d)); f(v); json.dump(v, open("%s/%s.json" % (sys.argv[2], name), "w"))
variant("ws", lambda v: v.__setitem__("pre_tokenizer", {"type": "Whitespace"}))
variant("removed", lambda v: v.__setitem__("pre_tokenizer", {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": " "}, "behavior": "Removed", "invert": False},
    {"type": "ByteLevel", "use_regex": False}]}))
variant("mergeform", lambda v: v["model"]["merges"].append("a b c"))
PY
expect_fail "pre_tokenizer 'Whitespace' is not supported" "$HP_DATA" encode --tokenizer "$W/ws.json" --text x
expect_fail "behavior 'Removed' is not supported" "$HP_DATA" encode --tokenizer "$W/removed.json" --text x
expect_fail "is not two tokens separated by one space" "$HP_DATA" encode --tokenizer "$W/mergeform.json" --text x
expect_fail "SentencePiece training failed" "$HP_DATA" train-tokenizer --input "$W/corpus.txt" --vocab-size 8 \
  --out "$W/tiny.model" --threads 1
head -c 100 "$W/sp.model" > "$W/cut.model"
expect_fail "not a SentencePiece model" "$HP_DATA" encode --tokenizer "$W/cut.model" --text x
expect_fail "cannot be read" "$HP_DATA" encode --tokenizer "$W/none.model" --text x
