#!/usr/bin/env bash
# Weights in the Hugging Face layout, checked against an independent PyTorch
# model (tests/level1/llama/reference.py, written from the published
# definitions), dense (the qwen3 naming: grouped-query attention, QK-norm;
# the qwen2 naming: multi-query attention with q/k/v biases, tied
# embeddings) and MoE (the mixtral naming: SwiGLU experts, softmax top-2
# router):
#   a run's step-1 checkpoint exported with hp-ckpt export --to-hf; the
#   reference on those weights and the run's step-2 batch gives the run's
#   step-2 loss within 1e-6 and every gradient within 1e-5;
#   export -> import --from-hf -> convert --consolidate is bitwise the
#   checkpoint's own consolidated weights, and the import's model.yaml
#   holds the model keys;
#   hp-generate on the import (with --config: its model.yaml and a data
#   section) gives the original checkpoint's tokens and log-probabilities;
#   the imported checkpoint loads at tp=2 (dense) or ep=2 (MoE), whose first
#   step matches one process loading it;
#   a file whose shapes do not match config.json is refused naming the tensor
#   and the expected shape; so are rope scaling, another head width, another
#   activation, an unknown family, a missing config.json, a tensor the
#   family lacks and a missing one; export refuses another family than the
#   model's, a checkpoint without a stored config, a gpt, shared experts.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
HERE=$(dirname "$0")
# Debian's PyTorch (python3-torch) is /usr/bin/python3's, whatever python3 is first on PATH.
small_config "$WORK/c.yaml"
common=(--set model.dropout=0 --set training.max_steps=2 --set checkpoint.interval=1 --set training.dump_grads_at_step=2
        --set training.dump_activations_steps=[2] --set training.eval_interval=0)
export HP_INTRA_OP_THREADS=1
check_variant() {  # check_variant NAME MODEL_YAML_FLOW FAMILY LAYOUT_ARGS...
  local name=$1 model=$2 family=$3; shift 3
  echo "== $name ($family)"
  sed -i "s/^model: .*/model: $model/" "$WORK/c.yaml"
  run "$name" 1
  local ck="$WORK/$name/checkpoints/step_00000001"
  "$BIN/hp-ckpt" export "$ck" --to-hf "$WORK/$name.hf" > "$WORK/$name.export" || fail "$name: export"
  grep -q "as $family" "$WORK/$name.export" || { cat "$WORK/$name.export"; fail "$name: not exported as $family"; }
  /usr/bin/python3 "$HERE/reference.py" "$WORK/$name.hf" "$WORK/$name" 2 || fail "$name: the PyTorch reference disagrees"
  "$BIN/hp-ckpt" import --from-hf "$WORK/$name.hf" --to "$WORK/$name.rt" > /dev/null || fail "$name: import"
  # The same weights as a sharded Hugging Face directory (two files and
  # model.safetensors.index.json) import to the same tensors.
  /usr/bin/python3 "$HERE/../../lib/same_tensors.py" --split "$WORK/$name.hf" "$WORK/$name.hf2" || fail "$name: split"
  "$BIN/hp-ckpt" import --from-hf "$WORK/$name.hf2" --to "$WORK/$name.rt2" > /dev/null || fail "$name: import sharded"
  python3 "$HERE/../../lib/same_tensors.py" "$WORK/$name.rt/step_00000000/model-rank00000.safetensors" \
    "$WORK/$name.rt2/step_00000000/model-rank00000.safetensors" || fail "$name: the sharded index imports other tensors"
  "$BIN/hp-ckpt" convert "$WORK/$name.rt" --consolidate --to "$WORK/$name.c1" > /dev/null || fail "$name: consolidate import"
  "$BIN/hp-ckpt" convert "$ck" --consolidate --to "$WORK/$name.c0" > /dev/null || fail "$name: consolidate original"
  python3 "$HERE/../../lib/same_tensors.py" "$WORK/$name.c0/model.safetensors" "$WORK/$name.c1/model.safetensors" \
    || fail "$name: export -> import -> consolidate is not the original"
  local kv
  kv=$(sed -n 's/.*kv_heads: \([0-9]*\).*/\1/p' <<<"$model")
  grep -q "^  kv_heads: $kv$" "$WORK/$name.rt/model.yaml" || { cat "$WORK/$name.rt/model.yaml"; fail "$name: model.yaml"; }
  local from=(--set checkpoint.resume="$WORK/$name.rt/step_00000000" --set training.max_steps=1 --set checkpoint.interval=0
              --set training.dump_grads_at_step=0 --set training.dump_activations_steps=[])
  run "$name.one" 1 "${from[@]}"
  run "$name.split" 2 "${from[@]}" "$@"
  grep -q "resumed from .*step_00000000" "$WORK/$name.split.log" || fail "$name: the split run did not load the import"
  "$BIN/hp-compare" "$WORK/$name.one" "$WORK/$name.split" --first-loss-rtol 1e-5 --loss-rtol 1e-5 --phase import \
    > "$WORK/cmp" 2>&1 || { cat "$WORK/cmp"; fail "$name: the imported weights at another layout"; }
}
check_variant dense "{type: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 96, seq_len: 32, vocab_size: 256, qk_norm: true}" \
  qwen3 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
echo "== hp-generate on the imported checkpoint (--config: its model.yaml and a data section) = on the original"
{ cat "$WORK/dense.rt/model.yaml"; echo "data: {type: text}"; } > "$WORK/imported.yaml"
"$BIN/hp-generate" "$WORK/dense/checkpoints/step_00000001" --set data.type=text --prompt 0123 --max-new-tokens 8 \
  --out "$WORK/gen0" > /dev/null 2> "$WORK/gen0.err" || { tail "$WORK/gen0.err"; fail "hp-generate on the original"; }
out=$("$BIN/hp-generate" "$WORK/dense.rt/step_00000000" --prompt 0123 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q "stores no config (an imported checkpoint): give --config FILE" <<<"$out" \
  || fail "hp-generate on an import without --config: exit $rc: $out"
"$BIN/hp-generate" "$WORK/dense.rt/step_00000000" --config "$WORK/imported.yaml" --prompt 0123 --max-new-tokens 8 \
  --out "$WORK/gen1" > /dev/null 2> "$WORK/gen1.err" || { tail "$WORK/gen1.err"; fail "hp-generate on the import"; }
python3 - "$WORK" <<'PY' || fail "the imported checkpoint generates other tokens"
import json, sys
a, b = (json.load(open("%s/%s/generate.json" % (sys.argv[1], n))) for n in ("gen0", "gen1"))
print("original %s, imported %s" % (a["tokens"], b["tokens"]))
sys.exit(0 if a["tokens"] == b["tokens"] and a["log_probs"] == b["log_probs"] and len(a["tokens"][0]) == 8 else 1)
PY
check_variant qwen2 "{type: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 1, ffn_hidden: 96, seq_len: 32, vocab_size: 64, qkv_bias: true, tie_embeddings: true}" \
  qwen2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
check_variant moe "{type: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 32, seq_len: 32, vocab_size: 64, moe: {num_experts: 4, top_k: 2, ffn_hidden: 32, aux_loss_coef: 0}}" \
  mixtral --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2

echo "== a file that does not match its config.json"
cp -r "$WORK/dense.hf" "$WORK/bad.hf"
sed -i 's/"intermediate_size": 96/"intermediate_size": 100/' "$WORK/bad.hf/config.json"
out=$("$BIN/hp-ckpt" import --from-hf "$WORK/bad.hf" --to "$WORK/bad.rt" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "a mismatched file: exit $rc, wanted 1: $out"
grep -qF "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 64], the qwen3 family with config.json's dimensions expects [100, 64]" \
  <<<"$out" || fail "the refusal does not name the tensor and the expected shape: $out"
import_refused() {  # import_refused DIR EXIT TEXT: hp-ckpt import --from-hf DIR exits EXIT naming TEXT
  local out rc
  out=$("$BIN/hp-ckpt" import --from-hf "$1" --to "$WORK/refused.rt" 2>&1); rc=$?
  [[ $rc -eq $2 ]] || fail "import of $1: exit $rc, wanted $2: $out"
  grep -qF -- "$3" <<<"$out" || fail "import of $1: the refusal lacks '$3': $out"
}
edit_config() {  # edit_config NAME PYTHON: a copy of dense.hf with config.json changed by PYTHON (c is the dict)
  rm -rf "$WORK/$1.hf"; cp -r "$WORK/dense.hf" "$WORK/$1.hf"
  python3 - "$WORK/$1.hf/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
PY
}
edit_config scaled 'c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}'
import_refused "$WORK/scaled.hf" 1 'rope_scaling {"factor":8.0,"rope_type":"llama3"}: scaled rotary frequencies'
edit_config wide 'c["head_dim"] = 32'
import_refused "$WORK/wide.hf" 1 "head_dim 32 differs from hidden_size / num_attention_heads = 16"
edit_config gelu 'c["hidden_act"] = "gelu"'
import_refused "$WORK/gelu.hf" 1 "hidden_act 'gelu': only silu (SwiGLU) is computed"
edit_config other 'c["model_type"] = "gpt_neox"'
import_refused "$WORK/other.hf" 2 "config.json model_type 'gpt_neox' is not a family this tool maps (known: llama, mistral, qwen2, qwen3, mixtral, qwen3_moe)"
import_refused "$WORK" 2 "config.json is missing: --from-hf needs a Hugging Face model directory"
# A sharded index that names a tensor the family lacks, and one that lacks one.
python3 - "$WORK/dense.hf2/model.safetensors.index.json" "$WORK/extra.idx" "$WORK/short.idx" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
extra = json.loads(json.dumps(j)); extra["weight_map"]["model.layers.0.mlp.bogus.weight"] = "model-00001-of-00002.safetensors"
short = json.loads(json.dumps(j)); del short["weight_map"]["model.norm.weight"]
json.dump(extra, open(sys.argv[2], "w")); json.dump(short, open(sys.argv[3], "w"))
PY
for k in extra short; do
  rm -rf "$WORK/$k.hf"; cp -r "$WORK/dense.hf2" "$WORK/$k.hf"; cp "$WORK/$k.idx" "$WORK/$k.hf/model.safetensors.index.json"
done
import_refused "$WORK/extra.hf" 1 "tensor 'model.layers.0.mlp.bogus.weight' is not one the qwen3 family has with these dimensions"
import_refused "$WORK/short.hf" 1 "tensor 'model.norm.weight' of shape [64] is missing"

echo "== exports refused"
export_refused() {  # export_refused DIR EXIT TEXT ARGS...
  local dir=$1 code=$2 text=$3 out rc; shift 3
  out=$("$BIN/hp-ckpt" export "$dir" --to-hf "$WORK/refused.hf" "$@" 2>&1); rc=$?
  [[ $rc -eq $code ]] || fail "export of $dir: exit $rc, wanted $code: $out"
  grep -qF -- "$text" <<<"$out" || fail "export of $dir: the refusal lacks '$text': $out"
}
export_refused "$WORK/dense/checkpoints" 2 "--family llama does not hold this model (experts no, qk_norm yes, qkv_bias no)" --family llama
export_refused "$WORK/dense.rt" 2 "stores no config (written before configs were, or imported)"
small_config "$WORK/g.yaml"
"$BIN/hp-train" "$WORK/g.yaml" --set training.max_steps=1 --set checkpoint.interval=1 --set run.output_dir="$WORK/gpt" \
  > "$WORK/gpt.log" 2>&1 || { tail "$WORK/gpt.log"; fail "gpt run"; }
export_refused "$WORK/gpt/checkpoints" 2 "model.type gpt: only the llama kind maps to a Hugging Face family"
sed -i "s/^model: .*/model: {type: llama, layers: 1, hidden: 64, heads: 4, seq_len: 32, vocab_size: 64, moe: {num_experts: 4, shared_experts: 1, ffn_hidden: 32}}/" "$WORK/g.yaml"
"$BIN/hp-train" "$WORK/g.yaml" --set training.max_steps=1 --set checkpoint.interval=1 --set run.output_dir="$WORK/shared" \
  > "$WORK/shared.log" 2>&1 || { tail "$WORK/shared.log"; fail "shared-expert run"; }
export_refused "$WORK/shared/checkpoints" 2 "the model has shared experts (no family here has them ungated), which no mapped family holds"
echo PASS
