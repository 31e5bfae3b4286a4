#!/usr/bin/env bash
# The smallest context-parallel loop: 2 ranks, cp=2 (each rank holds half of
# every sequence), loss falls; config errors for a size that does not divide
# the world, a sequence not divisible by 2 x size, and a model without a
# sequence.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set features.context_parallel.enabled=true \
  --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "training failed"; }
grep -q "mesh dp=1 cp=2 over 2 ranks" "$WORK/log" || fail "no cp=2 mesh in the log"
read -r first last <<<"$(first_last "$WORK/run")"
echo "loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "loss did not fall"
refused() {  # expected-line args...
  local want=$1
  shift
  out=$("$BIN/hp-train" "$WORK/c.yaml" --dry-run --set features.context_parallel.enabled=true "$@" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "expected exit 2, got $rc: $out"
  grep -qF "$want" <<<"$out" || fail "missing '$want' in: $out"
}
refused "features.context_parallel.size = 3: must divide the world size 2" --nproc 2 \
  --set features.context_parallel.size=3
refused "features.context_parallel.size = 2: needs the sequence length = 30 (model.seq_len) divisible by 2 x size = 4 (legal: a size whose double divides 30)" \
  --nproc 2 --set model.seq_len=30
refused "features.context_parallel.size = 2: model 'unet' is not a sequence model with attention" --nproc 2 \
  --set model.type=unet --set data.type=field
echo PASS
