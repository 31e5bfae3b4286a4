#!/usr/bin/env bash
# The llama model kind against one process (docs/PARITY.md: 20 steps, dropout
# $DROPOUT, evaluation at steps 10 and 20, first-step loss and every step-1
# gradient within 1e-5, losses within 1e-4). Grouped-query attention with 4
# query and 2 key/value heads and the QK-norm, so every split path runs:
#   tp=4 with sequence parallel: key/value heads shared by 2 ranks each
#     (their weights whole on every rank, gradients summed over tp), writing
#     sharded checkpoints; its step-10 checkpoint resumed at cp=2 (B9) and
#     at the same layout (bitwise, B2);
#   pp=2 under 1f1b, gpipe and zbv; per-module degrees (attention at tp=2, the FFN,
#     embedding and LM head at 4, sequence parallel);
#   interleaved 1F1B (pp=2) x tp=2 (key/value heads split) x block attention;
#   cp=2 (rotary positions by global position on the head-tail chunks) x dp=2
#     under zero stage 1;
#   dp=2 under zero stage 3, and the same with full recompute, bitwise;
# and the MoE variant (SwiGLU experts, a shared expert) against its own
# reference: ep=2 x tp=2 (expert tensor parallel), tp=2 (every expert split
# over tp), interleaved pp=2 x ep=2, zbv pp=2 x ep=2.
# HP_TEST_DROPOUT=0 runs them without dropout.
source "$(dirname "$0")/../combinations/lib.sh"
BIN=$1
llama_config() {  # llama_config FILE [MOE]
  small_config "$1"
  sed -i 's/^model: .*/model: {type: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 96, seq_len: 32, vocab_size: 64, qk_norm: true'"${2:+, moe: {num_experts: 4, top_k: 2, shared_experts: 1, ffn_hidden: 32\}}"'}/' "$1"
  grep -q "type: llama" "$1" || fail "could not write the llama config"
}
cp() { echo --set features.context_parallel.enabled=true --set features.context_parallel.size="$1"; }
t0=$SECONDS
CONFIG="$WORK/c.yaml"
llama_config "$CONFIG"
# shellcheck disable=SC2046
{
run ref 1 ""
run tp4sp 4 "dp=1 tp=4" $(tp 4) $(sp) --set features.sharded_checkpoint.enabled=true --set checkpoint.interval=10
run tp4sp_cp2 2 "" $(cp 2) --set checkpoint.resume="$WORK/tp4sp/checkpoints/step_00000010"
run tp4sp_again 4 "dp=1 tp=4" $(tp 4) $(sp) --set features.sharded_checkpoint.enabled=true \
  --set checkpoint.resume="$WORK/tp4sp/checkpoints/step_00000010"
run pp2 2 "pp=2 dp=1" $(pp 2)
run pp2g 2 "pp=2 dp=1" $(pp 2) --set features.pipeline_parallel.schedule=gpipe
run pp2v 2 "pp=2 dp=1" $(pp 2) --set features.pipeline_parallel.schedule=zbv
run mod4 4 "" $(tp 2) $(sp) --set features.tensor_parallel.ffn_size=4 --set features.tensor_parallel.embedding_size=4 \
  --set features.tensor_parallel.lm_head_size=4
run ppi2tp2blk 4 "pp=2 dp=1 tp=2" $(ppi 2) $(tp 2) $(blk)
run cp2dp2 4 "" $(cp 2) $(zero)
run dp2z3 2 "dp=2" $(zero) --set features.zero.stage=3
run dp2z3rc 2 "dp=2" $(zero) --set features.zero.stage=3 $(rc full)
}
parity ref tp4sp "tensor x sequence parallel, key/value heads shared"
# q, k and v (and SwiGLU's gate and up) read one gathered input: per
# micro-batch and layer one all-gather entering attention and one entering
# the FFN, one for the LM head, and one per reduce-scatter (2 per layer and
# the embedding's) in backward; each moves (tp - 1) x its local [2, 8, 64]
# fp32 slice from a rank. Three gathers for q, k, v would show here.
python3 - "$WORK/tp4sp/metrics.jsonl" <<'PY' || fail "tp4sp: tp all-gather bytes are not the formula's"
import json, sys
row = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
layers, micro, tp, local = 2, 4, 4, 2 * 8 * 64 * 4
want = micro * (2 * (2 * layers + 1)) * (tp - 1) * local
got = row["comm_bytes_tp_all_gather"]
print("tp all-gather bytes per step: %d, formula %d" % (got, want))
sys.exit(0 if got == want else 1)
PY
resumed_within tp4sp 11 tp4sp_cp2
resumed_bitwise tp4sp tp4sp_again 11
parity ref pp2 "pipeline, 1f1b"
parity ref pp2g "pipeline, gpipe"
parity ref pp2v "pipeline, zbv (RMS norms' and products' B and W apart)"
parity ref mod4 "per-module degrees: attention 2, FFN, embedding and LM head 4, sequence parallel"
parity ref ppi2tp2blk "interleaved pipeline x tensor parallel x block attention"
parity ref cp2dp2 "context x data parallel x zero stage 1"
parity ref dp2z3 "data parallel x zero stage 3"
replayed_every_step "$WORK/dp2z3rc" || fail "full recompute did not run"
bitwise dp2z3 dp2z3rc "full recompute under zero stage 3"

CONFIG="$WORK/m.yaml"
llama_config "$CONFIG" moe
# shellcheck disable=SC2046
{
run mref 1 ""
run mep2tp2 4 "" $(ep 2) $(tp 2)
run mtp2 2 "" $(tp 2)
run mppi2ep2 4 "" $(ppi 2) $(ep 2)
run mppv2ep2 4 "" $(pp 2) --set features.pipeline_parallel.schedule=zbv $(ep 2)
}
grep -qa "experts.gate.weight" "$WORK/mref/grads_step1/"* || fail "the MoE llama has no SwiGLU experts (no experts.gate.weight gradient)"
parity mref mep2tp2 "SwiGLU experts: expert x tensor parallel"
parity mref mtp2 "SwiGLU experts split over tensor parallel"
parity mref mppi2ep2 "SwiGLU experts: interleaved pipeline x expert parallel"
parity mref mppv2ep2 "SwiGLU experts (their stacked weights' W in B): zbv pipeline x expert parallel"
echo "llama layouts: $((SECONDS - t0)) s"
finish
