#!/usr/bin/env bash
# The smallest tensor-parallel loop: 2 ranks, tp=2, loss falls; a bad size is
# a config error.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set features.tensor_parallel.enabled=true \
  --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "training failed"; }
read -r first last <<<"$(first_last "$WORK/run")"
echo "loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "loss did not fall"
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run --set features.tensor_parallel.enabled=true \
      --set features.tensor_parallel.size=3 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "expected exit 2, got $rc"
grep -q "features.tensor_parallel.size = 3: must divide the world size 2" <<<"$out" || fail "$out"
grep -q "the head count = 4 (model.heads) is not divisible by it" <<<"$out" || fail "$out"
# Sequence parallel needs the sequence to divide, and refuses the unet model.
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run --set features.tensor_parallel.enabled=true \
      --set features.tensor_parallel.sequence_parallel=true --set model.seq_len=33 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "expected exit 2, got $rc"
grep -qF "features.tensor_parallel.size = 2: sequence_parallel needs the sequence length = 33 (model.seq_len) divisible by it" <<<"$out" || fail "$out"
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run --set features.tensor_parallel.enabled=true \
      --set features.tensor_parallel.sequence_parallel=true --set model.type=unet --set data.type=field 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "expected exit 2, got $rc"
grep -qF "features.tensor_parallel.sequence_parallel = true: model 'unet' cannot be split along its sequence (it states no sequence size; the unet reshapes along its grid) (legal: false for model unet)" <<<"$out" || fail "$out"
echo PASS
