#!/usr/bin/env bash
# The recompute feature on its own: both granularities train and the loss falls.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
for g in full selective; do
  "$BIN/hp-train" "$WORK/c.yaml" --set run.output_dir="$WORK/$g" \
    --set features.recompute.enabled=true --set features.recompute.granularity=$g > "$WORK/log" 2>&1 \
    || { cat "$WORK/log"; fail "$g failed"; }
  read -r first last <<<"$(first_last "$WORK/$g")"
  echo "$g: loss $first -> $last"
  python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "$g: loss did not fall"
done
# A bad option is a config error naming the key.
refused "$WORK/c.yaml" "features.recompute.blocks = 7: is more than model.layers = 2" \
  --set features.recompute.enabled=true --set features.recompute.blocks=7
refused "$WORK/c.yaml" "features.recompute.blocks = abc: must be 'all' or a whole number >= 1 (legal: all, 1, 2, ...)" \
  --set features.recompute.enabled=true --set features.recompute.blocks=abc
refused "$WORK/c.yaml" "features.recompute.granularity = selective: needs a model with attention (model 'mlp' has no attention.heads layer) (legal: full)" \
  --set features.recompute.enabled=true --set model.type=mlp --set features.recompute.granularity=selective
echo PASS
