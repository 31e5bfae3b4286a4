#!/usr/bin/env bash
# hp-report on a real run, seen by a browser: a 2-process pp=2 run (20
# steps, an evaluation every 10; run.report writes the page at its end, the
# same as hp-report RUN_DIR's), then headless Chromium
# (Debian's `chromium`) loads report.html from disk with the network off.
# check_page.py: the dumped DOM's points equal metrics.jsonl, the
# screenshot is not blank, the console logged nothing; and, so that check
# is worth something, a page with a script error does log it.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
command -v chromium > /dev/null || fail "chromium is not on PATH: install the Debian package 'chromium' (scripts/install-deps.sh does)"
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set features.pipeline_parallel.enabled=true \
  --set features.pipeline_parallel.size=2 --set training.eval_interval=10 --set training.eval_samples=4 \
  --set run.output_dir="$WORK/run" --set run.report=true > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "pp=2 run"; }
# run.report: hp-train wrote the page at the end of the run, the same page hp-report writes.
[[ -s "$WORK/run/report.html" ]] || { tail -5 "$WORK/log"; fail "run.report=true wrote no report.html"; }
mv "$WORK/run/report.html" "$WORK/from_train.html"
"$BIN/hp-report" "$WORK/run" || fail "hp-report"
[[ -s "$WORK/run/report.html" ]] || fail "no report.html"
cmp -s "$WORK/from_train.html" "$WORK/run/report.html" || fail "hp-train's run.report page differs from hp-report's"
grep -qE '(src|href)="(https?:)?//' "$WORK/run/report.html" && fail "the page loads something from the network"

source "$(dirname "$0")/../../lib/chromium.sh"
browse "$WORK" --dump-dom "file://$WORK/run/report.html" > "$WORK/dom.html" 2> "$WORK/dom.err" \
  || { tail -20 "$WORK/dom.err"; fail "chromium --dump-dom"; }
browse "$WORK" --screenshot="$WORK/shot.png" --window-size=1200,3000 --force-device-scale-factor=0.5 \
  "file://$WORK/run/report.html" > /dev/null 2> "$WORK/shot.err" || { tail -20 "$WORK/shot.err"; fail "chromium --screenshot"; }
python3 "$HERE/check_page.py" "$WORK/run/metrics.jsonl" "$WORK/dom.html" "$WORK/shot.png" \
  <(cat "$WORK/dom.err" "$WORK/shot.err") \
  'loss,eval_loss,lr,grad_norm,tokens_per_second,step_seconds,comm_(bytes|seconds)_pp_.*,pipeline_idle_fraction_stage[01]' \
  || fail "report page"

printf '<!DOCTYPE html><html><body><script>missing_function();</script></body></html>' > "$WORK/bad.html"
browse "$WORK" --dump-dom "file://$WORK/bad.html" > /dev/null 2> "$WORK/bad.err"
grep -q ':CONSOLE.*missing_function' "$WORK/bad.err" || fail "a script error did not reach the console log; the console check above proves nothing"
echo PASS
