#!/usr/bin/env bash
# The llama model kind: the shipped config (configs/llama_tp2.yaml, 2 processes,
# tp=2 with sequence parallel) trains on the fortunes corpus, shortened, and the
# loss falls; the log shows the mesh. Key/value head counts that neither divide
# nor are divided by the attention's degree, or that do not divide the query
# heads, are refused before start naming both numbers.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
CONFIG="$(dirname "$0")/../../configs/llama_tp2.yaml"
"$BIN/hp-train" "$CONFIG" --nproc 2 --set run.output_dir="$WORK/run" --set training.max_steps=30 \
  --set model.layers=2 --set model.hidden=128 --set model.ffn_hidden=344 --set model.seq_len=64 \
  --set training.eval_interval=0 --set checkpoint.interval=0 > "$WORK/log" 2>&1 || { tail -20 "$WORK/log"; fail "llama run failed"; }
read -r first last <<<"$(first_last "$WORK/run")"
echo "llama tp=2: loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.75 * $first else 1)" || fail "llama: loss did not fall"
grep -q "mesh dp=1 tp=2 over 2 ranks" "$WORK/log" || fail "llama: mesh line missing"
refused "$CONFIG" "config error: model.kv_heads = 3: must divide model.heads = 8" --set model.kv_heads=3
refused "$CONFIG" "features.tensor_parallel.size = 2: the key/value head count = 3 (model.kv_heads) neither is divisible by it nor divides it" \
  --set model.hidden=96 --set model.heads=6 --set model.kv_heads=3
refused "$CONFIG" "model.heads = 12: the head width model.hidden / model.heads = 21 must be even" \
  --set model.hidden=252 --set model.heads=12 --set model.kv_heads=4 --set features.tensor_parallel.enabled=false
P=features.tensor_parallel
refused "$CONFIG" "features.tensor_parallel.attention_size = 4: sharing the 2 key/value heads (model.kv_heads) over an attention degree above features.tensor_parallel.size = 2 is not supported yet" \
  --nproc 4 --set $P.attention_size=4
refused "$CONFIG" "features.tensor_parallel.attention_size = 4: a model with a QK-norm (model.qk_norm) runs attention at the stream's degree only" \
  --nproc 4 --set $P.attention_size=4 --set model.kv_heads=4 --set model.qk_norm=true
echo PASS
