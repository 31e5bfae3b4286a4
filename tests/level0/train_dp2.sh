#!/usr/bin/env bash
# Two data-parallel processes over Gloo: loss falls, and the rank-0 output
# names both ranks' mesh coordinates.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "training failed"; }
read -r first last <<<"$(first_last "$WORK/run")"
echo "loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "loss did not fall"
grep -q "hp-launch: starting 2 workers" "$WORK/log" || fail "hp-launch did not start 2 workers"
grep -q "mesh pp=1 dp=2 tp=1 ep=1 over 2 ranks" "$WORK/log" || fail "mesh line missing"
echo PASS
