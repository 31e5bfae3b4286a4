#!/usr/bin/env bash
# The comparison page at 50 runs: how long hp-report takes to write it and
# headless Chromium to load it (wall time of --dump-dom, beside the same
# browser loading an empty page: the difference is the page's own cost).
# The 50 runs: one real 40-step run of the small GPT (evaluations every 10
# steps), copied 50 times with its losses scaled by a per-run factor and
# optimizer.lr changed in its config.yaml (the page reads files only; what
# is measured is its rendering). Printed, never asserted.
#   bash bench/bench_report.sh [runs=50]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
N=${1:-50}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
source tests/lib/chromium.sh
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab_size: 64}
data: {type: synthetic}
training: {max_steps: 40, global_batch_size: 8, micro_batch_size: 2, log_interval: 1, eval_interval: 10}
checkpoint: {interval: 0}
YAML
HP_INTRA_OP_THREADS=1 "$BIN/hp-train" "$W/c.yaml" --set run.output_dir="$W/base" > "$W/base.log" 2>&1
python3 - "$W" "$N" <<'PY'
import json, os, sys
w, n = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(w + "/base/metrics.jsonl")]
config = open(w + "/base/config.yaml").read()
for i in range(n):
    d = "%s/runs/r%02d" % (w, i)
    os.makedirs(d)
    f = 1 + 0.01 * i
    with open(d + "/metrics.jsonl", "w") as out:
        for r in rows:
            r = dict(r)
            for k in ("loss", "eval_loss"):
                if k in r: r[k] *= f
            out.write(json.dumps(r) + "\n")
    open(d + "/config.yaml", "w").write(config.replace("lr: 0.001", "lr: %g" % (0.001 * f)))
PY
t0=$(date +%s.%N)
"$BIN/hp-report" "$W"/runs/r* --out "$W/page.html" > "$W/report.out"
t1=$(date +%s.%N)
echo '<!DOCTYPE html><html><body>empty</body></html>' > "$W/empty.html"
browse "$W" --dump-dom "file://$W/empty.html" > /dev/null 2>&1  # a first start warms the profile
t2=$(date +%s.%N); browse "$W" --dump-dom "file://$W/empty.html" > /dev/null 2>&1; t3=$(date +%s.%N)
browse "$W" --dump-dom "file://$W/page.html" > "$W/dom.html" 2>&1; t4=$(date +%s.%N)
python3 - "$t0" "$t1" "$t2" "$t3" "$t4" "$W/page.html" "$W/dom.html" "$N" <<'PY'
import sys
t0, t1, t2, t3, t4 = map(float, sys.argv[1:6])
page, dom, n = open(sys.argv[6]).read(), open(sys.argv[7]).read(), int(sys.argv[8])
print("%d runs x 40 steps: page %.0f KiB, %d polylines in the DOM" % (n, len(page) / 1024, dom.count("<polyline")))
print("hp-report writes it:            %.2f s" % (t1 - t0))
print("Chromium, empty page:           %.2f s" % (t3 - t2))
print("Chromium, the comparison page:  %.2f s  (the page's own cost: %.2f s)" % (t4 - t3, (t4 - t3) - (t3 - t2)))
PY
