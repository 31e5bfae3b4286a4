#!/usr/bin/env bash
# hp-generate: greedy continuations of two prompts of different lengths.
# A byte-level GPT trained 80 steps on a fortune file, at one process with
# the key/value cache, without it, and with block attention in the prefill;
# at tp=2 with sequence parallel, pp=2 (two micro-batches of requests), cp=2
# (the prefill laid over both ranks, the decode on the whole cache without
# the layout), dp=2 (one prompt per replica) and the seed recipe's decode
# layout (attention at dp=2; FFN, embedding and LM head at tp=2). A Llama
# MoE (grouped-query attention, rotary positions) at one process, ep=2,
# experts over tp=2 and cp=2; a GPT MoE at one process, ep=2 and experts
# over tp=2. Everywhere: the same tokens as one process, or the first
# difference where the one-process top-2 log-probability gap is within 1e-4
# (reported); each chosen token's log-probability within 1e-5 of one
# process's; the sum of the generated log-probabilities equal to one
# teacher-forced forward's within 1e-6 relative; the cache's bytes per
# token on rank 0 equal to layers x 2 x kv heads x head dim x 4 of the
# layout; at tp=2 no rank holds a split weight whole. Standard output holds
# only the text (no rank prefix under --nproc). Refused before start (exit
# 2, one line): a prompt longer than model.seq_len allows; a token corpus
# whose tokenizer file is gone.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
export HP_INTRA_OP_THREADS=1
text_config "$WORK/c.yaml" 48
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
gen one --teacher-forcing
gen nocache --no-kv-cache --teacher-forcing
gen block --set model.attention=block --set model.attention_block=8
gen tp2 --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set features.tensor_parallel.sequence_parallel=true
gen pp2 --nproc 2 --micro-batches 2 --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
# The seed recipe's decode layout: attention (the stream) at dp=2, the dense
# FFN, the embedding and the LM head at tp=2 over the same two ranks.
gen recipe --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=1 \
  --set features.tensor_parallel.ffn_size=2 --set features.tensor_parallel.embedding_size=2 \
  --set features.tensor_parallel.lm_head_size=2
# Attention above the stream's degree gathers the other rank's requests: the
# cache cannot hold them (refused, naming the way out); without it, it runs.
WIDE=(--nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=1
      --set features.tensor_parallel.attention_size=2)
out=$("$BIN/hp-generate" "$ck" --prompts "$WORK/prompts.txt" --max-new-tokens 4 "${WIDE[@]}" 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "the key/value cache does not hold other ranks' requests .*or generate without the cache" <<<"$out" \
  || fail "wide attention with the cache: exit $rc: $out"
gen wide --no-kv-cache "${WIDE[@]}"
gen cp2 --nproc 2 --set features.context_parallel.enabled=true --set features.context_parallel.size=2
gen dp2 --nproc 2
grep -q '\[rank' "$WORK"/*.out && fail "a rank prefix on standard output"
[[ $(wc -l < "$WORK/tp2.out") -eq 2 ]] || fail "tp2: standard output is not the two continuations"
# At tp=2 generation runs on the split weights: no rank holds a split one whole.
python3 - "$WORK/tp2/generate.json" <<'PY' || fail "tp2: a rank held a split weight whole"
import json, sys
s = json.load(open(sys.argv[1]))["split_params"]
print("tp2: %d split parameters, %d held whole by some rank" % (s["count"], s["held_whole_by_some_rank"]))
sys.exit(0 if s["count"] > 0 and s["held_whole_by_some_rank"] == 0 else 1)
PY
cat > "$WORK/compare.py" <<'PY'
import json, sys
w, ref_name, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
formula = dict(x.split("=") for x in sys.argv[4].split(","))  # run name -> bytes per token on rank 0
ref = json.load(open("%s/%s/generate.json" % (w, ref_name)))
assert all(len(t) == 24 for t in ref["tokens"]), "one process: not 24 tokens each"
bad = 0
for name in [ref_name] + names:
    run = json.load(open("%s/%s/generate.json" % (w, name)))
    kv = run["kv_cache"]
    want = int(formula.get(name, 0))
    print("%s: cache %d bytes per token (%d layers x 2 x %d kv heads x %d x %d bytes), formula %d" % (
        name, kv["bytes_per_token"], kv["layers"], kv["kv_heads"], kv["head_dim"], kv["element_bytes"], want))
    if kv["bytes_per_token"] != want or kv["bytes_per_token"] != kv["layers"] * 2 * kv["kv_heads"] * kv["head_dim"] * kv["element_bytes"]:
        bad += 1
    for p, tf in enumerate(run.get("teacher_forced", [])):
        gen = sum(run["log_probs"][p])
        rel = abs(tf - gen) / max(abs(gen), 1e-12)
        print("%s prompt %d: generated log-probabilities sum %.9f, teacher-forced %.9f (relative %.1e)" % (name, p, gen, tf, rel))
        bad += rel > 1e-6
for name in names:
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
python3 "$WORK/compare.py" "$WORK" one nocache,block,tp2,pp2,cp2,dp2,recipe,wide one=1024,block=1024,wide=0,tp2=512,pp2=512,cp2=1024,dp2=1024,nocache=0,recipe=1024 \
  || fail "the GPT's layouts generated other tokens"
# A Llama MoE: grouped-query attention (4 heads, 2 kv heads) with rotary positions, 4 experts.
cat > "$WORK/llama.yaml" <<'YAML'
run: {seed: 7}
model: {type: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 96, seq_len: 48, vocab_size: 256,
        moe: {num_experts: 4, top_k: 2, ffn_hidden: 32}}
data: {type: text, path: /usr/share/games/fortunes/computers}
training: {max_steps: 60, global_batch_size: 8, micro_batch_size: 4, log_interval: 20, eval_interval: 0}
optimizer: {type: adamw, lr: 0.003, warmup_steps: 2, grad_clip: 1.0}
checkpoint: {interval: 60}
YAML
"$BIN/hp-train" "$WORK/llama.yaml" --set run.output_dir="$WORK/lref" > "$WORK/lref.log" 2>&1 || { tail "$WORK/lref.log"; fail "training the Llama MoE"; }
ck="$WORK/lref/checkpoints"
gen lone --teacher-forcing
gen lep2 --nproc 2 --teacher-forcing --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2
gen ltp2 --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
gen lcp2 --nproc 2 --set features.context_parallel.enabled=true --set features.context_parallel.size=2
python3 "$WORK/compare.py" "$WORK" lone lep2,ltp2,lcp2 lone=512,lep2=512,ltp2=256,lcp2=512 || fail "the Llama MoE's layouts generated other tokens"
# The GPT MoE (4 experts, top 2) at one process, ep=2 and experts over tp=2.
"$BIN/hp-train" "$WORK/c.yaml" --set model.moe.num_experts=4 --set model.moe.top_k=2 --set training.max_steps=40 \
  --set checkpoint.interval=40 --set training.eval_interval=0 --set model.dropout=0 --set optimizer.lr=0.003 \
  --set run.output_dir="$WORK/mref" > "$WORK/mref.log" 2>&1 || { tail "$WORK/mref.log"; fail "training the GPT MoE"; }
ck="$WORK/mref/checkpoints"
gen mone --teacher-forcing
gen mep2 --nproc 2 --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2
gen mtp2 --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
python3 "$WORK/compare.py" "$WORK" mone mep2,mtp2 mone=1024,mep2=1024,mtp2=512 || fail "the GPT MoE's layouts generated other tokens"
ck="$WORK/ref/checkpoints"
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
# An unreadable --config.
out=$("$BIN/hp-generate" "$ck" --prompt "Unix" --config "$WORK/no-such.yaml" 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q -- "--config $WORK/no-such.yaml: cannot be read" <<<"$out" || fail "unreadable --config: exit $rc: $out"
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
# A sample prompt longer than model.seq_len in the corpus's tokens: refused at start.
out=$("$BIN/hp-train" "$WORK/c.yaml" --set data.type=tokens --set data.path="$WORK/corpus" --set model.vocab_size=400 \
  --set training.sample_interval=1 --set "training.sample_prompt=$(printf 'computer %.0s' $(seq 60))" \
  --set run.output_dir="$WORK/toklong" 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "training.sample_prompt is [0-9]* tokens; model.seq_len 48 holds at most 47: shorten the prompt" <<<"$out" \
  || fail "a long sample prompt in corpus tokens: exit $rc: $out"
rm "$WORK/corpus/tokenizer.model"
out=$("$BIN/hp-generate" "$WORK/tok/checkpoints" --prompt "Unix" 2>&1); rc=$?
[[ $rc -eq 2 && $(wc -l <<<"$out") -eq 1 ]] && grep -q "corpus/tokenizer.model, is missing" <<<"$out" \
  || fail "missing tokenizer: exit $rc: $out"
echo PASS
