#!/usr/bin/env bash
# run.profile on a pp=2 run: every rank's trace holds forward and backward
# spans in exactly the order of its schedule action list (printed by
# hp_print_schedule from the plugin's own schedule code, for the run's
# schedule, stages, micro-batches and chunks), for 1f1b and for
# interleaved_1f1b with 2 chunks per rank; the trace is valid Chrome
# trace-event JSON (spans nest, one track per rank) with collectives, stage
# waits, the optimizer step, evaluation and checkpoint save in it; with the
# profile off nothing is written; hp-report draws the timeline.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
SCHEDULE=$2
HERE=$(cd "$(dirname "$0")" && pwd)
small_config "$WORK/c.yaml"
# 4 steps, 4 micro-batches per step; steps 2 and 3 profiled; step 2 also
# evaluates and saves a checkpoint.
common=(--nproc 2 --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
        --set training.max_steps=4 --set training.eval_interval=2 --set training.eval_samples=4
        --set checkpoint.interval=2)

run() {  # run NAME SCHEDULE V [more --set ...]
  local name=$1 kind=$2 v=$3
  shift 3
  "$BIN/hp-train" "$WORK/c.yaml" "${common[@]}" --set features.pipeline_parallel.schedule="$kind" \
    --set features.pipeline_parallel.virtual_stages="$v" --set run.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { tail -30 "$WORK/$name.log"; fail "$name run"; }
}

check() {  # check NAME SCHEDULE V
  local name=$1 kind=$2 v=$3
  [[ -s "$WORK/$name/trace.json" ]] || fail "$name: no trace.json"
  grep -q "profile of steps \[2, 3\] written to $WORK/$name/trace.json" "$WORK/$name.log" \
    || fail "$name: the run did not log where the trace went"
  for rank in 0 1; do
    "$SCHEDULE" "$kind" 2 4 "$v" "$rank" > "$WORK/$name.schedule$rank" || fail "hp_print_schedule $kind"
  done
  python3 "$HERE/check_trace.py" "$WORK/$name/trace.json" 2 3 "$WORK/$name.schedule0" "$WORK/$name.schedule1" \
    || fail "$name: trace"
}

run one_f_one_b 1f1b 1 --set run.profile.enabled=true --set run.profile.steps=[2,3]
check one_f_one_b 1f1b 1
run interleaved interleaved_1f1b 2 --set run.profile.enabled=true --set run.profile.steps=[2,3]
check interleaved interleaved_1f1b 2

run off 1f1b 1
[[ -e "$WORK/off/trace.json" || -e "$WORK/off/trace" ]] && fail "profile off wrote a trace"
grep -q "profile of steps" "$WORK/off.log" && fail "profile off logged a trace"

"$BIN/hp-report" "$WORK/one_f_one_b" > /dev/null || fail "hp-report"
python3 - "$WORK/one_f_one_b/report.html" <<'PY' || fail "report timeline"
import re, sys
html = open(sys.argv[1]).read()
assert '<h2 id="timeline">Timeline of step 2</h2>' in html, "no timeline of step 2"
spans = re.findall(r'<rect class="span" [^>]*data-rank="(\d+)"[^>]*data-name="([^"]*)"', html)
for rank in ("0", "1"):
    names = {n for r, n in spans if r == rank}
    assert {"step", "forward", "backward"} <= names, (rank, names)
PY
echo PASS
