#!/usr/bin/env bash
# The mixed_precision feature on its own: bf16 trains and the loss falls,
# the log states the policy and the product kernel, the checkpoint it
# writes holds fp32 masters; bad options are config errors naming the key.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --set run.output_dir="$WORK/bf16" --set checkpoint.interval=20 \
  --set features.mixed_precision.enabled=true > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "bf16 run failed"; }
read -r first last <<<"$(first_last "$WORK/bf16")"
echo "bf16: loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "bf16: loss did not fall"
grep -q "mixed precision: compute copies and activations bf16, gradient sums in fp32, masters and optimizer state fp32; bf16 products: \(native\|widen\) (auto)" "$WORK/log" \
  || fail "the log does not state the policy"
# On a CPU without bf16 instructions: one warning naming the missing flag.
if ! grep -qw avx512_bf16 /proc/cpuinfo; then
  [[ $(grep -c "this CPU lacks avx512_bf16, so bf16 products run on the fp32 BLAS" "$WORK/log") -eq 1 ]] \
    || fail "no single warning about the missing avx512_bf16"
  "$BIN/hp-train" "$WORK/c.yaml" --set run.output_dir="$WORK/native" --set training.max_steps=1 \
    --set features.mixed_precision.enabled=true --set features.mixed_precision.product_kernel=native \
    > "$WORK/native.log" 2>&1 || { cat "$WORK/native.log"; fail "native run failed"; }
  grep -q "features.mixed_precision.product_kernel native on a CPU without avx512_bf16" "$WORK/native.log" \
    || fail "no warning for the native kernel without avx512_bf16"
fi
grep -q "peak .* GFLOP/s per rank for MFU (metrics.peak_flops: the bf16 peak)" "$WORK/log" || fail "MFU's peak is not the bf16 one"
"$BIN/hp-ckpt" inspect "$WORK/bf16/checkpoints/step_00000020" > "$WORK/inspect" || fail "hp-ckpt inspect"
grep -q "^precision    bf16 compute" "$WORK/inspect" || { cat "$WORK/inspect"; fail "inspect: precision"; }
if grep -E "^(embed|blocks|head)\." "$WORK/inspect" | grep -vq " F32 "; then
  cat "$WORK/inspect"; fail "a model tensor of the bf16 checkpoint is not F32 (fp32)"
fi
refused "$WORK/c.yaml" "features.mixed_precision.param_dtype = fp16: not a known choice (did you mean 'bf16'?) (legal: one of: bf16, fp32; fp16 and fp8 are not supported)" \
  --set features.mixed_precision.enabled=true --set features.mixed_precision.param_dtype=fp16
refused "$WORK/c.yaml" "features.mixed_precision.reduce_dtype = fp8" \
  --set features.mixed_precision.enabled=true --set features.mixed_precision.reduce_dtype=fp8
refused "$WORK/c.yaml" "features.mixed_precision.enabled = true: needs a model whose token embedding starts the activation stream (model 'unet' has no embedding.vocab layer)" \
  --set features.mixed_precision.enabled=true --set model.type=unet --set data.type=field
echo PASS
