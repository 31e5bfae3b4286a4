#!/usr/bin/env bash
# The smallest context-parallel loop: 2 ranks, cp=2 (each rank holds half of
# every sequence), loss falls. The config errors are
# ut.context_parallel.config_errors.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set features.context_parallel.enabled=true \
  --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "training failed"; }
grep -q "mesh dp=1 cp=2 over 2 ranks" "$WORK/log" || fail "no cp=2 mesh in the log"
read -r first last <<<"$(first_last "$WORK/run")"
echo "loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "loss did not fall"
echo PASS
