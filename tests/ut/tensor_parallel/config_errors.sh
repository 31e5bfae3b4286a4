#!/usr/bin/env bash
# Per-module tensor-parallel degrees before any process starts (hp-train
# --dry-run): each module kind's view is printed with its groups; every rule
# is refused verbatim with exit 2, one line each.
HP_TRAIN=$1
source "$(dirname "$0")/../../lib/dry_run.sh"
cat > "$dir/c.yaml" <<'YAML'
model: {type: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab_size: 64}
data: {type: synthetic}
training: {max_steps: 3, global_batch_size: 8, micro_batch_size: 2}
features: {tensor_parallel: {enabled: true, size: 1}}
YAML
P=features.tensor_parallel
out=$("$HP_TRAIN" "$dir/c.yaml" --nproc 4 --dry-run --set $P.ffn_size=4 --set $P.attention_size=2 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "dry-run exit $rc: $out"
for want in "mesh dp=4 tp=1 attn_tp_inner=1 attn_tp_outer=2 attn_dp=2 ffn_tp_inner=1 ffn_tp_outer=4 ffn_dp=1 (world 4)" \
  "view tensor_parallel.attention over tp x dp: attn_tp_inner = 1 split; attn_tp_outer = 2 split; attn_dp = 2 replicate;" \
  "flat group ffn_tp = ffn_tp_inner x ffn_tp_outer (tensor_parallel)" \
  "rank 2 -> dp 2, tp 0, attn_tp_inner 0, attn_tp_outer 0, attn_dp 1, ffn_tp_inner 0, ffn_tp_outer 2, ffn_dp 0 -> tp[2] dp[0,1,2,3] attn_tp_inner[2] attn_tp_outer[2,3] attn_dp[0,2] ffn_tp_inner[2] ffn_tp_outer[0,1,2,3] ffn_dp[2] attn_tp[2,3] ffn_tp[0,1,2,3]"; do
  grep -qF -- "$want" <<<"$out" || fail "missing '$want' in: $out"
done
refused "features.tensor_parallel.ffn_size = 3: must be a multiple of features.tensor_parallel.size = 2 (the residual stream's degree: a module gathers the samples of degree / size data-parallel neighbours) (legal: 0 (= size) or a multiple of 2)" \
  4 --set $P.size=2 --set $P.ffn_size=3
refused "features.tensor_parallel.ffn_size = 8: must divide the world size 4 (legal: 0 (= size) or a divisor of 4 that is a multiple of 2)" \
  4 --set $P.size=2 --set $P.ffn_size=8
refused "features.tensor_parallel.attention_size = 4: the head count = 2 (model.heads) is not divisible by it (legal: a divisor of 2)" \
  4 --set $P.attention_size=4 --set model.heads=2
refused "features.tensor_parallel.ffn_size = 4: the FFN size = 6 (model.ffn_hidden) is not divisible by it (legal: a divisor of 6)" \
  4 --set $P.ffn_size=4 --set model.ffn_hidden=6
refused "features.tensor_parallel.lm_head_size = 2: the LM head shares the token embedding's weight (model.tie_embeddings), so its degree must equal the embedding's, 1 (legal: the embedding's degree, or model.tie_embeddings: false)" \
  4 --set $P.lm_head_size=2 --set model.tie_embeddings=true
refused "features.tensor_parallel.lm_head_size = 2: per-module degrees with context_parallel (cp) are not supported yet: a module gathers whole samples of its neighbours (legal: 0 (= size), or disable context_parallel)" \
  4 --set $P.lm_head_size=2 --set features.context_parallel.enabled=true
refused "distributed.mesh_order = dp-tp: per-module tensor-parallel degrees need tp inside dp (a module's ranks are the stream's tp ranks of neighbouring data-parallel replicas) (legal: an order with tp before dp, e.g. tp-dp-pp, or \"\" (by role))" \
  4 --set $P.lm_head_size=2 --set distributed.mesh_order=dp-tp
refused "features.tensor_parallel.lm_head_size = 2: model 'unet' is not a language model built from embedding, attention or FFN and LM head kinds, which per-module degrees re-lay out (legal: 0 (= size) for model unet)" \
  2 --set $P.lm_head_size=2 --set model.type=unet --set data.type=field
# Every layer a MoE layer without shared experts: no dense FFN to split
# (with one shared expert, the FFN's degree splits it).
refused "features.tensor_parallel.ffn_size = 2: model 'gpt' builds no mlp layer for this degree to split (the dense FFN (and a MoE layer's shared experts); every layer is a MoE layer without shared experts) (legal: 0 (= size))" \
  4 --set $P.ffn_size=2 --set model.moe.num_experts=4
out=$("$HP_TRAIN" "$dir/c.yaml" --nproc 4 --dry-run --set $P.ffn_size=2 --set model.moe.num_experts=4 \
  --set model.moe.shared_experts=1 2>&1) || fail "ffn_size with a shared expert refused: $out"
# Expert tensor parallel: over the stream's split dimension, or not at all.
X=(--set model.moe.num_experts=4 --set features.expert_parallel.enabled=true)
refused "features.expert_parallel.tensor_size = 4: expert tensor parallel splits each expert's FFN over the mesh's split dimension, of size 2 (tensor_parallel) (legal: 1 or 2)" \
  4 "${X[@]}" --set features.expert_parallel.tensor_size=4 --set $P.size=2
refused "features.expert_parallel.tensor_size = 2: expert tensor parallel splits each expert's FFN over the mesh's split dimension, and none is claimed (legal: 1 (enable tensor_parallel with size > 1 to split experts))" \
  4 "${X[@]}" --set features.expert_parallel.tensor_size=2 --set $P.enabled=false
refused "features.expert_parallel.tensor_size = 2: the expert FFN width = 5 (model.moe.ffn_hidden) is not divisible by it (legal: a divisor of 5)" \
  4 "${X[@]}" --set features.expert_parallel.tensor_size=2 --set $P.size=2 --set model.moe.ffn_hidden=5 \
  --set features.expert_parallel.size=2
echo PASS
