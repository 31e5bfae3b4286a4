#!/usr/bin/env bash
# docs/PARITY.md for per-module tensor-parallel degrees against one process
# (first-step loss and every gradient within 1e-5; 20-step losses, grad
# norms and eval losses within 1e-4), dropout 0.1, an uneven vocabulary:
#   2 ranks: attention data-parallel (1) + dense FFN at 2; attention 2 + FFN 1
#   4 ranks: attention 2, FFN 4, embedding 4, LM head 4 (and again with
#            sequence parallel, zero and recompute); pp = 2 outside
#            (attention 1, FFN 2, LM head 2)
#   MoE (shared expert in the FFN kind): every expert's FFN over tp 2 (no
#            ep); attention 1 + experts ep 4;
#            attention 2 + experts ep 2 + LM head 4; attention 2 + experts
#            etp 2 x ep 2 (slices and padded expert compute)
# and the bytes each module's outer group moves per step equal the RFC's
# table (docs/rfc/0013), read from the comm figures.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1 --set model.vocab_size=66 --set features.tensor_parallel.enabled=true)
P=features.tensor_parallel
"$BIN/hp-train" "$WORK/c.yaml" --set training.dump_grads_at_step=1 --set model.vocab_size=66 \
  --set run.output_dir="$WORK/ref" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "reference"; }
REF=ref
case_() {  # name nproc mesh-line [args]
  local name=$1 n=$2 mesh=$3
  shift 3
  run "$name" "$n" "$@"
  grep -q "mesh $mesh over" "$WORK/$name.log" || fail "$name: wrong mesh (want $mesh): $(grep -m1 'mesh ' "$WORK/$name.log")"
  compare_b4 "$REF" "$name" "per-module tensor-parallel optimizer steps"
}
case_ a1f2 2 "dp=2 tp=1 ffn_tp_inner=1 ffn_tp_outer=2 ffn_dp=1" --set $P.size=1 --set $P.ffn_size=2
case_ a2f1 2 "dp=2 tp=1 attn_tp_inner=1 attn_tp_outer=2 attn_dp=1" --set $P.size=1 --set $P.attention_size=2
all4=(--set $P.size=2 --set $P.ffn_size=4 --set $P.embedding_size=4 --set $P.lm_head_size=4)
m4="dp=2 tp=2 ffn_tp_inner=2 ffn_tp_outer=2 ffn_dp=1 embed_tp_inner=2 embed_tp_outer=2 embed_dp=1 head_tp_inner=2 head_tp_outer=2 head_dp=1"
case_ a2f4e4h4 4 "$m4" "${all4[@]}"
case_ a2f4e4h4sp 4 "$m4" "${all4[@]}" --set $P.sequence_parallel=true --set features.zero.enabled=true \
  --set features.recompute.enabled=true
case_ pp2 4 "pp=2 dp=2 tp=1 ffn_tp_inner=1 ffn_tp_outer=2 ffn_dp=1 head_tp_inner=1 head_tp_outer=2 head_dp=1" \
  --set $P.size=1 --set $P.ffn_size=2 --set $P.lm_head_size=2 --set features.pipeline_parallel.enabled=true

# Bytes per step each module's outer group of M ranks sent (comm figures:
# M - 1 times a rank's own rows per all-gather or reduce-scatter). Per
# micro-batch of t tokens, h features: attention and FFN 2 x 4ht per layer
# each way (the entry's gather and the exit's gradient gather; the exit's
# reduce-scatter and the entry's gradient reduce-scatter); the embedding
# gathers its token ids (8t) and 4ht of gradient, reduce-scatters 4ht; the
# LM head gathers 4ht and its targets (8t), reduce-scatters 4ht of
# gradient. Step 1: 2 micro-batches of 2 x 32 tokens, h = 64, 2 layers, M = 2.
python3 - "$WORK/a2f4e4h4/metrics.jsonl" <<'PY' || fail "per-module bytes differ from the RFC's table"
import json, sys
row = json.loads(open(sys.argv[1]).readline())
t, h, layers, micro, M = 2 * 32, 64, 2, 2, 2
want = {
    "ffn_tp_outer_all_gather": (M - 1) * micro * layers * 2 * 4 * h * t,
    "ffn_tp_outer_reduce_scatter": (M - 1) * micro * layers * 2 * 4 * h * t,
    "embed_tp_outer_all_gather": (M - 1) * micro * (8 * t + 4 * h * t),
    "embed_tp_outer_reduce_scatter": (M - 1) * micro * 4 * h * t,
    "head_tp_outer_all_gather": (M - 1) * micro * (4 * h * t + 8 * t),
    "head_tp_outer_reduce_scatter": (M - 1) * micro * 4 * h * t,
}
for k, v in want.items():
    got = row.get("comm_bytes_" + k)
    assert got == v, (k, got, v)
    print("%-32s %8d bytes per step (table: %d)" % (k, got, v))
assert not any(k.startswith("comm_bytes_attn_") for k in row), "attention at the stream's degree has no view"
PY

# MoE: experts over ep folded over the ranks attention sees as tp x dp.
moe=(--set model.moe.num_experts=4 --set model.moe.top_k=2 --set model.moe.every=2 --set model.moe.shared_experts=1)
"$BIN/hp-train" "$WORK/c.yaml" --set training.dump_grads_at_step=1 --set model.vocab_size=66 "${moe[@]}" \
  --set run.output_dir="$WORK/moe_ref" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "MoE reference"; }
common+=("${moe[@]}")
REF=moe_ref
E=(--set features.expert_parallel.enabled=true --set features.expert_parallel.size)
# The MoE tensor-parallel mode (no expert parallel): every expert on both
# ranks, each expert's FFN split over tp, fc2's bias added after the sum.
case_ moe_tp2 2 "dp=1 tp=2" --set $P.size=2
case_ moe_a1ep4 4 "dp=4 tp=1 ffn_tp_inner=1 ffn_tp_outer=4 ffn_dp=1 ep=4 edp=1" --set $P.size=1 --set $P.ffn_size=4 "${E[@]}=4"
case_ moe_a2ep2 4 "dp=2 tp=2 head_tp_inner=2 head_tp_outer=2 head_dp=1 ep=2 edp=1" --set $P.size=2 --set $P.lm_head_size=4 "${E[@]}=2"
# Expert tensor parallel: each expert's FFN split over the stream's tp too
# (etp 2 x ep 2), with the slice loop and with the padded batched matmul.
case_ moe_a2etp2ep2 4 "dp=2 tp=2 ep=2 edp=1" --set $P.size=2 "${E[@]}=2" --set features.expert_parallel.tensor_size=2
case_ moe_a2etp2ep2pad 4 "dp=2 tp=2 head_tp_inner=2 head_tp_outer=2 head_dp=1 ep=2 edp=1" --set $P.size=2 \
  --set $P.lm_head_size=4 "${E[@]}=2" --set features.expert_parallel.tensor_size=2 --set model.moe.expert_compute=padded
echo PASS
