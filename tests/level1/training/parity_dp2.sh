#!/usr/bin/env bash
# docs/PARITY.md for data parallel: dp=2 against one process with the same global
# batch and micro-batches (first-step loss and every gradient within 1e-5,
# 20-step losses within 1e-4), and two dp=2 runs with one seed bitwise equal.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1)
"$BIN/hp-train" "$WORK/c.yaml" "${common[@]}" --set run.output_dir="$WORK/ref" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "reference run failed"; }
for r in a b; do
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${common[@]}" --set run.output_dir="$WORK/dp2$r" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "dp=2 run failed"; }
done
echo "== dp=2 against one process"
"$BIN/hp-compare" "$WORK/ref" "$WORK/dp2a" --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --eval-rtol 1e-5 --grad-rtol 1e-5 \
  --phase "gradient sync or optimizer" || fail "dp=2 parity"
echo "== two dp=2 runs, same seed"
"$BIN/hp-compare" "$WORK/dp2a" "$WORK/dp2b" --exact --phase "nondeterminism" || fail "same-seed runs differ"
echo PASS
