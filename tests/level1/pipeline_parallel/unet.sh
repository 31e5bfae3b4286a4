#!/usr/bin/env bash
# The unet model (its encoder's skip crosses stage boundaries next to the
# hidden state: two tensors of different shapes per message) at pp=2 and pp=4
# against one process: 50-step losses within 1e-6.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
unet_config "$WORK/u.yaml" 50
"$BIN/hp-train" "$WORK/u.yaml" --set run.output_dir="$WORK/ref" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "reference"; }
read -r first last <<<"$(first_last "$WORK/ref")"
echo "one process: loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "unet does not learn"
for P in 2 4; do
  "$BIN/hp-train" "$WORK/u.yaml" --nproc $P --set features.pipeline_parallel.enabled=true \
    --set features.pipeline_parallel.size=$P --set run.output_dir="$WORK/pp$P" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "pp$P"; }
  grep "pipeline: " "$WORK/log" | head -1
  # Some boundary between the down-sample and the decoder carries the skip.
  python3 - "$WORK/pp$P/metrics.jsonl" <<'PY' || fail "pp$P: no message header was sent"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert r[-1]["pipeline_headers_sent"] >= 1, r[-1]
PY
  echo "== unet pp=$P against one process"
  "$BIN/hp-compare" "$WORK/ref" "$WORK/pp$P" --first-loss-rtol 1e-6 --loss-rtol 1e-6 --norm-rtol 1e-5 --phase "unet pipeline" | tail -2
  [[ ${PIPESTATUS[0]} -eq 0 ]] || fail "unet pp=$P parity"
done
echo PASS
