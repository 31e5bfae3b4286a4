#!/usr/bin/env bash
# Two data-parallel processes over Gloo: loss falls, and the rank-0 output
# names both ranks' mesh coordinates. An evaluation set the replicas cannot
# split into whole micro-batches is refused before start.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "training failed"; }
read -r first last <<<"$(first_last "$WORK/run")"
echo "loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "loss did not fall"
grep -q "hp-launch: starting 2 workers" "$WORK/log" || fail "hp-launch did not start 2 workers"
grep -q "mesh dp=2 over 2 ranks" "$WORK/log" || fail "mesh line missing"
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run --set training.eval_samples=6 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "eval_samples=6 at dp=2: exit $rc, wanted 2: $out"
grep -qF "config error: training.eval_samples = 6: must be divisible by micro_batch_size x data-parallel size = 2 x 2 = 4, so every replica evaluates whole micro-batches (legal: 0 (one global batch), or a multiple of 4)" <<<"$out" || fail "$out"
echo PASS
