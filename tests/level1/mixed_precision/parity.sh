#!/usr/bin/env bash
# bf16 mixed precision at every layout against one process in bf16
# (docs/PARITY.md, "Mixed precision"): 20 steps, dropout $DROPOUT,
# evaluation at steps 10 and 20, step-1 gradients, at the bf16 bars
# (first-step loss and every step-1 gradient within $GRAD_RTOL, losses within
# $LOSS_RTOL), all from one bf16 reference run:
#   interleaved 1F1B (pp=2, 2 chunks) x tp=2 with sequence parallel (stage
#   messages, tensor-parallel sums and gathers in bf16);
#   dp=2 under zero stage 3 with bf16 gradient sums (bf16 gathers of the
#   weights, bf16 reduce-scatters), and under stage 1 (fp32 sums, fp32
#   gathers of the updated slices);
#   cp=2 x dp=2 (the ring's keys, values and their gradients in bf16);
#   the MoE GPT at ep=2 against its own one-process bf16 run;
#   full recompute, bitwise equal to the reference (the replay runs the same
#   bf16 ops);
#   block attention against eager attention, both in bf16;
#   the native bf16 product kernel (ATen's, oneDNN where the CPU has
#   AVX-512) against the widening one, and a layout under the native kernel
#   with DNNL_MAX_CPU_ISA=AVX512_CORE (oneDNN without bf16 instructions; on
#   a CPU without AVX-512 ATen's own loop runs either way);
# and bf16 against fp32 on the same model, at the bf16-vs-fp32 bar; and the
# bytes each group moves per step (counted by the groups, rank 0) against
# fp32 twins of four layouts: half where activations or weights move
# (sequence-parallel gathers and scatters, stage messages, the ring, the
# expert all-to-all, zero-3's gathers and its bf16 gradient sums).
# HP_TEST_DROPOUT=0 runs them without dropout.
source "$(dirname "$0")/../combinations/lib.sh"
BIN=$1
CONFIG="$WORK/c.yaml"
small_config "$CONFIG"
# Measured spreads and the bars derived from them: docs/PARITY.md.
GRAD_RTOL=3e-2
LOSS_RTOL=1e-2
FIRST_RTOL=1e-2
VS_FP32_RTOL=1e-2
# The router's weight gradient (MoE) cancels (p (g - sum p g)): bf16 moves
# it by 5.6e-2 against fp32 in one process, so layouts get a bar of its own.
ROUTER_RTOL=1e-1
mp() { echo --set features.mixed_precision.enabled=true; }
cp() { echo --set features.context_parallel.enabled=true --set features.context_parallel.size="$1"; }
bf16_parity() {
  echo "== $2 against $1 (bf16)"
  "$BIN/hp-compare" "$WORK/$1" "$WORK/$2" --grads-step 1 --first-loss-rtol "$FIRST_RTOL" --loss-rtol "$LOSS_RTOL" \
    --eval-rtol "$LOSS_RTOL" --grad-rtol "$GRAD_RTOL" \
    --grad-bar "router.weight=$ROUTER_RTOL" --phase "$3" > "$WORK/cmp" 2>&1
  local rc=$?
  grep "max relative error" "$WORK/cmp" | head -4
  report_cmp $rc "$2 against $1 ($3)"
}
t0=$SECONDS
# shellcheck disable=SC2046
{
run fp32 1 ""
run ref 1 "" $(mp)
run rcf 1 "" $(mp) $(rc full)
run blk 1 "" $(mp) $(blk)
run ppi2tp2sp 4 "pp=2 dp=1 tp=2" $(mp) $(ppi 2) $(tp 2) $(sp)
run dp2z3 2 "dp=2" $(mp) $(zero) --set features.zero.stage=3 --set features.mixed_precision.reduce_dtype=bf16
run dp2z1 2 "dp=2" $(mp) $(zero) --set features.zero.stage=1
run cp2dp2 4 "" $(mp) $(cp 2)
MOE=(--set model.moe.num_experts=4 --set model.moe.top_k=2 --set model.moe.z_loss_coef=0.001)
run moeref 1 "" $(mp) "${MOE[@]}"
run moeep2tp2 4 "" $(mp) "${MOE[@]}" $(ep 2) $(tp 2)
# The fp32 twins are read at step 2 only (their bytes per step): 3 steps.
TWIN=(--set training.max_steps=3 --set training.eval_interval=0)
run ppi2tp2sp32 4 "pp=2 dp=1 tp=2" $(ppi 2) $(tp 2) $(sp) "${TWIN[@]}"
run dp2z332 2 "dp=2" $(zero) --set features.zero.stage=3 "${TWIN[@]}"
run cp2dp232 4 "" $(cp 2) "${TWIN[@]}"
run moeep2tp232 4 "" "${MOE[@]}" $(ep 2) $(tp 2) "${TWIN[@]}"
run native 1 "" $(mp) --set features.mixed_precision.product_kernel=native
DNNL_MAX_CPU_ISA=AVX512_CORE run ppi2tp2native 4 "pp=2 dp=1 tp=2" $(mp) $(ppi 2) $(tp 2) \
  --set features.mixed_precision.product_kernel=native
}
bf16_parity ref ppi2tp2sp "bf16: interleaved pipeline x tensor x sequence parallel"
bf16_parity ref dp2z3 "bf16: data parallel x zero-3, bf16 gradient sums"
bf16_parity ref dp2z1 "bf16: data parallel x zero-1"
bf16_parity ref cp2dp2 "bf16: context parallel x data parallel"
bf16_parity ref blk "bf16: block attention against eager"
bf16_parity moeref moeep2tp2 "bf16: the MoE GPT at expert parallel x tensor parallel"
bf16_parity ref native "bf16: the native product kernel against the widening one"
bf16_parity native ppi2tp2native "bf16, native kernel, oneDNN without bf16 instructions: pipeline x tensor parallel"
replayed_every_step "$WORK/rcf" || fail "full recompute did not run in bf16"
bitwise ref rcf "bf16: full recompute"
echo "== bf16 against fp32"
"$BIN/hp-compare" "$WORK/fp32" "$WORK/ref" --loss-rtol "$VS_FP32_RTOL" --first-loss-rtol "$VS_FP32_RTOL" \
  --eval-rtol "$VS_FP32_RTOL" --phase "bf16 against fp32" > "$WORK/cmp" 2>&1
report_cmp $? "bf16 against fp32"
# halved FP32_RUN BF16_RUN OPS: the step-2 bytes of every group operation
# matching OPS (an extended regular expression over "<group>_<op>") in the
# bf16 run are half the fp32 run's (0.45-0.51: a few fp32 and integer
# control messages, e.g. counts, ride along in the same operations).
halved() {
  echo "== bytes per step, $2 against $1"
  python3 - "$WORK/$1/metrics.jsonl" "$WORK/$2/metrics.jsonl" "$3" <<'PY' || FAILED+=("bytes of $2 against $1")
import json, re, sys
step2 = lambda f: next(json.loads(l) for l in open(f) if json.loads(l).get("step") == 2)
a, b = step2(sys.argv[1]), step2(sys.argv[2])
keys = [k for k in a if k.startswith("comm_bytes_") and re.fullmatch(sys.argv[3], k[11:]) and a[k] > 0]
bad = 0
for k in sorted(keys):
    r = b.get(k, 0) / a[k]
    ok = 0.45 <= r <= 0.51
    bad += not ok
    print(f"  {k[11:]:24} fp32 {a[k]:10.0f}  bf16 {b.get(k, 0):10.0f}  ratio {r:.3f}{'' if ok else '  NOT HALVED'}")
if not keys:
    print(f"  no operation matches {sys.argv[3]}"); bad = 1
sys.exit(1 if bad else 0)
PY
}
halved ppi2tp2sp32 ppi2tp2sp "(tp_(all_gather|reduce_scatter)|pp_send)"
halved dp2z332 dp2z3 "dp_(all_gather|reduce_scatter)"
halved cp2dp232 cp2dp2 "cp_send"
halved moeep2tp232 moeep2tp2 "(ep_all_to_all|tp_(all_reduce|all_gather))"
echo "mixed precision layouts: $((SECONDS - t0)) s"
finish
