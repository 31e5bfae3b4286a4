#!/usr/bin/env bash
# hp-sweep and the comparison page. A sweep of the small GPT (6 steps) over
# training.micro_batch_size=2,3 x optimizer.lr=0.001,0.003 with 2 seeds: the
# 4 variants with micro-batch 3 are refused by the config check (listed with
# the reason, skipped), the other 4 run. Rerunning after one run lost its
# finished mark reruns that run only: the finished runs' files are not
# touched (paths, sizes and modification times equal). Another grid in the
# same directory is refused (exit 2). The page (hp-report SWEEP_DIR): the
# differing keys are optimizer.lr and run.seed only, every chart has one
# series per run, the summary has differences from the baseline, the seed
# table two variants as mean ± deviation; headless Chromium loads it with
# an empty console and the DOM keeps one line per run. hp-report RUN RUN
# --out writes the same kind of page for two run directories.
source "$(dirname "$0")/../../lib/common.sh"
source "$(dirname "$0")/../../lib/chromium.sh"
BIN=$1
export HP_INTRA_OP_THREADS=1
small_config "$WORK/c.yaml"
sed -i 's/max_steps: 20/max_steps: 6/; s/eval_interval: 10/eval_interval: 3/' "$WORK/c.yaml"
sweep() {
  "$BIN/hp-sweep" "$WORK/c.yaml" --grid training.micro_batch_size=2,3 --grid optimizer.lr=0.001,0.003 --repeat 2 \
    --set checkpoint.interval=0 --out "$WORK/sw" "$@"
}
sweep > "$WORK/s1.out" 2> "$WORK/s1.err" || { cat "$WORK/s1.out" "$WORK/s1.err"; fail "the sweep"; }
cat "$WORK/s1.out"
[[ $(grep -cE '^run-[0-9]+ .* refused +-' "$WORK/s1.out") -eq 4 && $(grep -cE '^run-[0-9]+ .* done +[0-9]' "$WORK/s1.out") -eq 4 ]] \
  || fail "expected 4 refused and 4 finished runs in the summary"
grep -q "refused by the config check, skipped: .*training.global_batch_size" "$WORK/s1.err" || fail "no refusal reason"
grep -q "8 runs: 4 finished, 0 failed, 4 refused" "$WORK/s1.out" || fail "summary totals"
grep -q "ETA" "$WORK/s1.err" || fail "no progress line"
finished() { find "$WORK/sw/runs" -path '*/run-00[0-9]/*' -type f ! -path "*/$1/*" -printf '%p %s %T@\n' | sort; }
# run-001 loses its finished mark: as if the sweep had been killed during it.
finished run-001 > "$WORK/before"
rm "$WORK/sw/runs/run-001/sweep_done.json"
sweep > "$WORK/s2.out" 2> "$WORK/s2.err" || { cat "$WORK/s2.err"; fail "the continued sweep"; }
[[ $(grep -c "finished before, kept" "$WORK/s2.err") -eq 3 ]] && grep -q "running run-001" "$WORK/s2.err" \
  && [[ $(grep -c "running run-" "$WORK/s2.err") -eq 1 ]] || { cat "$WORK/s2.err"; fail "the continued sweep ran other runs"; }
finished run-001 > "$WORK/after"
cmp -s "$WORK/before" "$WORK/after" || { diff "$WORK/before" "$WORK/after"; fail "a finished run's files were touched"; }
[[ -f "$WORK/sw/runs/run-001/sweep_done.json" ]] || fail "run-001 was not finished again"
out=$("$BIN/hp-sweep" "$WORK/c.yaml" --grid optimizer.lr=0.01 --out "$WORK/sw" 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q "holds another sweep" <<<"$out" || fail "another sweep in the same directory: exit $rc: $out"
out=$("$BIN/hp-sweep" "$WORK/c.yaml" --grid optimizer.lr --out "$WORK/sw2" 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q -- "--grid optimizer.lr: expected KEY=V1,V2,..." <<<"$out" || fail "a bad --grid: exit $rc: $out"
# The comparison page.
rm -f "$WORK/sw/report.html"
"$BIN/hp-report" "$WORK/sw" > /dev/null || fail "hp-report SWEEP_DIR"
python3 - "$WORK/sw/report.html" <<'PY' || fail "the comparison page"
import re, sys
html = open(sys.argv[1]).read()
diff = re.search(r'<table class="differing">(.*?)</table>', html, re.S).group(1)
keys = re.findall(r'<th>([^<]+)</th>', diff)[1:]
assert keys == ["optimizer.lr", "run.seed"], keys
for fig in ["cmp-loss", "cmp-eval-loss", "cmp-loss-tokens", "cmp-loss-time", "cmp-tokens-per-second", "cmp-memory"]:
    body = re.search(r'<figure id="%s">(.*?)</figure>' % fig, html, re.S).group(1)
    assert body.count("<polyline") == 4, (fig, body.count("<polyline"))
summary = re.search(r'<table class="summary">(.*?)</table>', html, re.S).group(1)
assert summary.count("(baseline)") == 1 and len(re.findall(r'class="delta[^"]*">\([+-=]', summary)) >= 6, summary[:400]
seeds = re.search(r'<table class="seeds">(.*?)</table>', html, re.S).group(1)
assert seeds.count("<tr") == 3 and "&plusmn;" in seeds, seeds[:300]
print("differing keys %s; 4 series per chart; seed table of 2 variants" % keys)
PY
command -v chromium > /dev/null || fail "chromium is not on PATH: install the Debian package 'chromium' (scripts/install-deps.sh does)"
browse "$WORK" --dump-dom "file://$WORK/sw/report.html" > "$WORK/dom.html" 2> "$WORK/dom.err" \
  || { tail -20 "$WORK/dom.err"; fail "chromium --dump-dom"; }
grep -q ':CONSOLE' "$WORK/dom.err" && { grep ':CONSOLE' "$WORK/dom.err"; fail "the page logged to the console"; }
python3 - "$WORK/dom.html" <<'PY' || fail "the DOM Chromium built"
import re, sys
dom = open(sys.argv[1]).read()
body = re.search(r'<figure id="cmp-loss">(.*?)</figure>', dom, re.S).group(1)
n = len(re.findall(r"<polyline", body))
assert n == 4, n
print("Chromium's DOM: 4 loss lines")
PY
"$BIN/hp-report" "$WORK/sw/runs/run-000" "$WORK/sw/runs/run-002" --out "$WORK/two.html" > /dev/null \
  || fail "hp-report RUN RUN"
out=$("$BIN/hp-report" "$WORK/sw" --baseline run-999 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q -- "--baseline run-999: no run of that name" <<<"$out" || fail "an unknown baseline: exit $rc: $out"
grep -q '<th>optimizer.lr</th>' "$WORK/two.html" && ! grep -q '<th>run.seed</th>' "$WORK/two.html" \
  || fail "two runs: the differing keys"
echo PASS
