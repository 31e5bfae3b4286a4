#!/usr/bin/env bash
# hp-generate: greedy continuations of two prompts of different lengths from
# a byte-level GPT trained 20 steps on a fortune file, at one process and at
# tp=2 with sequence parallel, pp=2, cp=2 and dp=2 (one prompt per replica):
# the same tokens, or the first difference where the one-process top-2
# log-probability gap is within 1e-4 (reported); each chosen token's
# log-probability within 1e-5 of one process's. Standard output holds only
# the text (no rank prefix under --nproc). Refused before start (exit 2,
# one line): a prompt longer than model.seq_len allows; a token corpus whose
# tokenizer file is gone.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
export HP_INTRA_OP_THREADS=1
small_config "$WORK/c.yaml"
sed -i 's/, vocab_size: 64/, vocab_size: 256/; s/seq_len: 32/seq_len: 48/; s|^data: .*|data: {type: text, path: /usr/share/games/fortunes/computers}|' \
  "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --set checkpoint.interval=80 --set training.max_steps=80 --set training.eval_interval=0 --set model.dropout=0 --set optimizer.lr=0.003 \
  --set run.output_dir="$WORK/ref" > "$WORK/ref.log" 2>&1 || { tail "$WORK/ref.log"; fail "training"; }
ck="$WORK/ref/checkpoints"
printf '%s\n' "The computer" "Unix is" > "$WORK/prompts.txt"
gen() {  # gen NAME ARGS...
  local name=$1; shift
  "$BIN/hp-generate" "$ck" --prompts "$WORK/prompts.txt" --max-new-tokens 24 --greedy --out "$WORK/$name" "$@" \
    > "$WORK/$name.out" 2> "$WORK/$name.err" || { tail "$WORK/$name.err"; fail "hp-generate $name ($*)"; }
  echo "-- $name: $(head -c 120 "$WORK/$name.out" | tr '\n' '|')"
}
gen one
gen tp2 --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set features.tensor_parallel.sequence_parallel=true
gen pp2 --nproc 2 --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
gen cp2 --nproc 2 --set features.context_parallel.enabled=true --set features.context_parallel.size=2
gen dp2 --nproc 2
grep -q '\[rank' "$WORK"/*.out && fail "a rank prefix on standard output"
[[ $(wc -l < "$WORK/tp2.out") -eq 2 ]] || fail "tp2: standard output is not the two continuations"
python3 - "$WORK" <<'PY' || fail "the layouts generated other tokens"
import json, sys
w = sys.argv[1]
ref = json.load(open(w + "/one/generate.json"))
assert all(len(t) == 24 for t in ref["tokens"]), "one process: not 24 tokens each"
bad = 0
for name in ["tp2", "pp2", "cp2", "dp2"]:
    run = json.load(open("%s/%s/generate.json" % (w, name)))
    for p, (a, b) in enumerate(zip(ref["tokens"], run["tokens"])):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        n = len(a) if first is None else first
        worst = max([abs(x - y) / max(abs(x), 1e-12) for x, y in zip(ref["log_probs"][p][:n], run["log_probs"][p][:n])] or [0])
        if first is None:
            print("%s prompt %d: the same %d tokens; log-probabilities within %.1e" % (name, p, len(a), worst))
        else:
            gap = ref["top2_gaps"][p][first]
            print("%s prompt %d: first difference at token %d, where the top-2 gap is %.2e" % (name, p, first, gap))
            bad += gap > 1e-4
        bad += worst > 1e-5
sys.exit(1 if bad else 0)
PY
# --dry-run: the layout, nothing started.
"$BIN/hp-generate" "$ck" --prompt "Unix" --dry-run --nproc 2 --set features.tensor_parallel.enabled=true \
  --set features.tensor_parallel.size=2 > "$WORK/dry.out" 2>&1 || { cat "$WORK/dry.out"; fail "dry run"; }
grep -q "tp=2" "$WORK/dry.out" && grep -q "nothing was started" "$WORK/dry.out" || { cat "$WORK/dry.out"; fail "dry run output"; }
# Both --prompt and --prompts.
out=$("$BIN/hp-generate" "$ck" --prompt "Unix" --prompts "$WORK/prompts.txt" 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q "give one of --prompt TEXT or --prompts FILE" <<<"$out" || fail "both prompt options: exit $rc: $out"
# A prompt too long for model.seq_len (48 bytes).
out=$("$BIN/hp-generate" "$ck" --prompt "$(printf 'x%.0s' $(seq 60))" 2>&1); rc=$?
[[ $rc -eq 2 && $(wc -l <<<"$out") -eq 1 ]] && grep -q "prompt 0 is 60 tokens; model.seq_len 48 holds at most 47" <<<"$out" \
  || fail "long prompt: exit $rc: $out"
# A token corpus whose tokenizer is gone.
"$BIN/hp-data" train-tokenizer --input /usr/share/games/fortunes/computers --vocab-size 400 --out "$WORK/sp.model" \
  --threads 1 > /dev/null
"$BIN/hp-data" prepare --input /usr/share/games/fortunes/computers --tokenizer "$WORK/sp.model" --split-on % \
  --out "$WORK/corpus" > /dev/null 2>&1
"$BIN/hp-train" "$WORK/c.yaml" --set data.type=tokens --set data.path="$WORK/corpus" --set model.vocab_size=400 \
  --set training.max_steps=2 --set checkpoint.interval=2 --set run.output_dir="$WORK/tok" > "$WORK/tok.log" 2>&1 \
  || { tail "$WORK/tok.log"; fail "training on tokens"; }
"$BIN/hp-generate" "$WORK/tok/checkpoints" --prompt "Unix" --max-new-tokens 4 > "$WORK/tok.out" 2> "$WORK/tok.err" \
  || { cat "$WORK/tok.err"; fail "hp-generate on a token corpus"; }
rm "$WORK/corpus/tokenizer.model"
out=$("$BIN/hp-generate" "$WORK/tok/checkpoints" --prompt "Unix" 2>&1); rc=$?
[[ $rc -eq 2 && $(wc -l <<<"$out") -eq 1 ]] && grep -q "corpus/tokenizer.model, is missing" <<<"$out" \
  || fail "missing tokenizer: exit $rc: $out"
echo PASS
