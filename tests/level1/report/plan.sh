#!/usr/bin/env bash
# hp-plan. (1) Its layouts against the config check: for the small GPT (4
# layers) at 2 ranks with micro-batches 2 and 3 (3 does not divide the
# batch at one replica) in fp32 and bf16 (--precisions), with per-module
# tensor-parallel degrees and 2 or 3 interleaved chunks, every layout it
# lists as accepted is accepted by the config check and every one it lists
# as refused is refused, both kinds present
# (all of them through hp-sweep --dry-run, the first of each kind through
# hp-train --dry-run's exit code). (2) The model state it predicts per
# rank equals, to the byte, what training reports (rank 0's metrics.jsonl:
# parameters, gradients and optimizer state under zero stages 1-3 at dp=2;
# the optimizer state at tp=2 and at pp=2). (3) --measure 2 --rounds 2:
# two layouts through hp-sweep twice over (4 runs; each layout's step its
# faster round), predicted against measured printed, predicted.json and
# peaks.json in each run (the large block pool's most in use and extent
# per rank, in order), the comparison page with the planner's table (one
# row per run). Figures are printed, never asserted (bench_plan.sh).
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
export HP_INTRA_OP_THREADS=1 HP_PLAN_CACHE="$WORK/cache"
small_config "$WORK/c.yaml"
sed -i 's/max_steps: 20/max_steps: 3/; s/eval_interval: 10/eval_interval: 0/; s/dropout: 0.1/dropout: 0.0/' "$WORK/c.yaml"

# Usage errors: exit 2 with the rule.
out=$("$BIN/hp-plan" "$WORK/c.yaml" --nproc 2 --measure 2 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"--measure needs --out DIR"* ]] || fail "--measure without --out: exit $rc: $out"
out=$("$BIN/hp-plan" "$WORK/c.yaml" --nproc 2 --rounds 2 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"--rounds 2 needs --measure K"* ]] || fail "--rounds without --measure: exit $rc: $out"
out=$("$BIN/hp-plan" "$WORK/c.yaml" --nproc 2 --micro-batch-sizes 2,x 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"expected integers separated by commas"* ]] || fail "bad --micro-batch-sizes: exit $rc: $out"
out=$("$BIN/hp-plan" "$WORK/c.yaml" --nproc 2 --precisions fp32,fp16 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"each of fp32 and bf16"* ]] || fail "bad --precisions: exit $rc: $out"
out=$("$BIN/hp-sweep" "$WORK/c.yaml" --out "$WORK/nogrid" 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"give --grid"* ]] || fail "hp-sweep without a grid: exit $rc: $out"
out=$("$BIN/hp-sweep" "$WORK/c.yaml" --grid optimizer.lr=0.1,0.2 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"--out SWEEP_DIR is required"* ]] || fail "hp-sweep without --out: exit $rc: $out"
out=$("$BIN/hp-sweep" "$WORK/c.yaml" --variant "optimizer.lr" --out "$WORK/badvariant" 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"expected KEY=V items"* ]] || fail "hp-sweep bad --variant: exit $rc: $out"

# (1) the enumeration against hp-train's own check
# (4 layers: 6 blocks, so interleaved_1f1b runs 2 or 3 chunks a rank)
"$BIN/hp-plan" "$WORK/c.yaml" --set model.layers=4 --nproc 2 --micro-batch-sizes 2,3 --precisions fp32,bf16 --layouts \
  > "$WORK/layouts" 2> "$WORK/layouts.err" \
  || { cat "$WORK/layouts.err"; fail "hp-plan --layouts"; }
accepted=$(grep -c '^accepted' "$WORK/layouts"); refused=$(grep -c '^refused' "$WORK/layouts")
echo "hp-plan lists $accepted accepted and $refused refused layouts"
[[ $accepted -gt 10 && $refused -gt 10 ]] || fail "expected both kinds of layouts, got $accepted and $refused"
grep -q "refused.*micro_batch_size" "$WORK/layouts" || fail "a refusal without its reason"
grep -q "^accepted.*features.mixed_precision.enabled=true" "$WORK/layouts" || fail "no bf16 layout accepted"
grep -q "^accepted.*features.mixed_precision.enabled=false" "$WORK/layouts" || fail "no fp32 layout accepted"
# The per-module degrees (a module at 2 over a stream of 1: the data-parallel
# pair's samples gathered) and the chunk counts.
grep -q "^accepted.*tensor_parallel.size=1 .*attention_size=2 .*ffn_size=0 " "$WORK/layouts" \
  || fail "no layout with attention alone at degree 2"
grep -q "^accepted.*tensor_parallel.size=2 .*attention_size=0 " "$WORK/layouts" || fail "no tp=2 layout"
grep -q "^accepted.*interleaved_1f1b --set features.pipeline_parallel.virtual_stages=3" "$WORK/layouts" \
  || fail "no interleaved layout of 3 chunks a rank"
# Every listed layout through hp-sweep --dry-run (the config check hp-train
# runs, one process for all of them), and the first of each kind through
# hp-train --dry-run itself (exit 0 accepted, 2 refused).
kinds=(); variants=()
while IFS=$'\t' read -r kind sets _; do
  kinds+=("$kind"); variants+=(--variant "${sets//--set /}")
done < "$WORK/layouts"
mkdir "$WORK/here"
(cd "$WORK/here" && "$BIN/hp-sweep" "$WORK/c.yaml" --set model.layers=4 --nproc 2 --dry-run "${variants[@]}") > "$WORK/checked" \
  2> "$WORK/checked.err" || { cat "$WORK/checked.err"; fail "hp-sweep --dry-run"; }
[[ -z $(ls -A "$WORK/here") ]] || fail "hp-sweep --dry-run wrote files: $(ls -A "$WORK/here")"
grep -q "^dry run: ${#kinds[@]} runs, $accepted accepted, $refused refused by the config check" "$WORK/checked" \
  || { tail -1 "$WORK/checked"; fail "hp-sweep --dry-run's totals"; }
mapfile -t got < <(grep '^run-' "$WORK/checked" | cut -f2)
for i in "${!kinds[@]}"; do
  [[ ${got[$i]} == "${kinds[$i]}" ]] || fail "hp-plan lists ${kinds[$i]} but the config check says ${got[$i]}: ${variants[$((2 * i + 1))]}"
done
for kind in accepted refused; do
  sets=$(grep -m1 "^$kind" "$WORK/layouts" | cut -f2)
  code=0
  # shellcheck disable=SC2086
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run --set model.layers=4 $sets > /dev/null 2>&1 || code=$?
  [[ ($kind == accepted && $code -eq 0) || ($kind == refused && $code -eq 2) ]] \
    || fail "hp-train --dry-run exits $code for a layout hp-plan lists as $kind: $sets"
done

# (2) model state to the byte
state_case() {  # state_case NAME SETS...: train 3 steps, then compare rank 0's figures with --dry-run's
  local name=$1; shift
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "$@" --set run.output_dir="$WORK/$name" > "$WORK/$name.log" 2>&1 \
    || { cat "$WORK/$name.log"; fail "training $name"; }
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run "$@" > "$WORK/$name.dry" 2>&1 || fail "--dry-run $name"
  python3 - "$WORK/$name" "$WORK/$name.dry" "$name" <<'PY' || fail "model state of $name"
import json, re, sys
run, dry, name = sys.argv[1:4]
last = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l][-1]
m = re.search(r"ranks 0[-,\d]* model state bytes: params (\d+), grads (\d+), optimizer (\d+)", open(dry).read())
assert m, "no model state line in --dry-run's output"
params, grads, opt = map(int, m.groups())
measured = {"optimizer": last["optimizer_state_bytes"]}
if "zero_param_bytes" in last:
    measured["params"] = last["zero_param_bytes"]
    measured["grads"] = last["zero_full_grad_bytes"] + last["zero_slice_grad_bytes"]
predicted = {"params": params, "grads": grads, "optimizer": opt}
print(f"{name}: predicted {predicted}, measured {measured}")
for k, v in measured.items():
    assert int(v) == predicted[k], f"{k}: predicted {predicted[k]}, measured {int(v)}"
PY
}
for z in 1 2 3; do state_case zero$z --set features.zero.enabled=true --set features.zero.stage=$z; done
state_case tp2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
state_case pp2 --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2

# (3) --measure through the sweep, and the page
"$BIN/hp-plan" "$WORK/c.yaml" --nproc 2 --top 3 --measure 2 --rounds 2 --out "$WORK/m" > "$WORK/m.out" 2> "$WORK/m.err" \
  || { cat "$WORK/m.err" "$WORK/m.out"; fail "hp-plan --measure"; }
cat "$WORK/m.out"
grep -q "calibrated micro-batch 2" "$WORK/m.err" || fail "no calibration line"
grep -qE "^ +1  [a-z]" "$WORK/m.out" || fail "no ranked layouts"
grep -q "^predicted against measured.*fastest step and largest memory of 2 rounds" "$WORK/m.out" \
  || fail "no comparison table"
# One row per layout: the first two ranked, each measured in both rounds
# (runs 0 and 2, 1 and 3), its step the faster of its two.
python3 - "$WORK/m.out" "$WORK/m/runs" <<'PY' || fail "the rounds' figures"
import json, re, statistics, sys
out, runs = open(sys.argv[1]).read(), sys.argv[2]
ranked = re.findall(r"^ +[12]  (\S.*?\S) +\d+\.\d{3} ", out, re.M)
rows = re.findall(r"^(\S.*?\S) +\d+ +\d+ +-?[\d.]+ +[\d.]+ +([\d.]+) +-?[\d.]+$", out.split("predicted against measured")[1], re.M)
assert [r[0] for r in rows] == ranked, (rows, ranked)
def step(run):
    s = [json.loads(l)["step_seconds"] for l in open(f"{runs}/{run}/metrics.jsonl") if '"step_seconds"' in l]
    return statistics.median(s[2:])
for i, (label, measured) in enumerate(rows):
    assert json.load(open(f"{runs}/run-{i:03d}/predicted.json"))["layout"] == label
    assert json.load(open(f"{runs}/run-{i + 2:03d}/predicted.json"))["layout"] == label
    fastest = min(step(f"run-{i:03d}"), step(f"run-{i + 2:03d}"))
    assert abs(float(measured) - fastest) < 0.0006, (label, measured, fastest)
print("2 layouts x 2 rounds: each row the faster round")
PY
grep -qE "^memory error: mean [0-9.]+ %, max [0-9.]+ %; step time error: mean [0-9.]+ %" "$WORK/m.out" \
  || fail "no error summary"
for r in run-000 run-001 run-002 run-003; do
  [[ -s "$WORK/m/runs/$r/predicted.json" && -s "$WORK/m/runs/$r/peaks.json" ]] || fail "$r: predicted.json or peaks.json"
  # The large block pool's figures per rank (on by default): its extent
  # holds at least its most in use, and both sit within the rank's peak.
  python3 - "$WORK/m/runs/$r/peaks.json" <<'PY' || fail "$r: the pool's figures in peaks.json"
import json, sys
j = json.load(open(sys.argv[1]))
peak, start = j["peak_resident_memory_bytes"], j["start_resident_memory_bytes"]
used, extent = j["large_block_pool_peak_in_use_bytes"], j["large_block_pool_extent_bytes"]
assert len(peak) == len(start) == len(used) == len(extent) == 2, j
for p, s, u, e in zip(peak, start, used, extent):
    assert 0 < u <= e, (u, e)
    assert e <= p, (e, p)
PY
done
python3 - "$WORK/m/report.html" <<'PY' || fail "the page's planner table"
import re, sys
page = open(sys.argv[1]).read()
table = re.search(r'<table class="planner">(.*?)</table>', page, re.S)
assert table, "no planner table"
rows = re.findall(r'<tr data-run="(run-\d+)">', table.group(1))
assert rows == ["run-000", "run-001", "run-002", "run-003"], rows
assert re.search(r'class="num">[+-]\d+\.\d%', table.group(1)), "no error cell"
PY
# A second plan reads the cached calibration; --only keeps the layouts whose
# label matches (attention above the stream here), a bad expression exits 2.
"$BIN/hp-plan" "$WORK/c.yaml" --nproc 2 --top 50 --only 'attn[0-9]' > "$WORK/again.out" 2> "$WORK/again.err" \
  || fail "second plan"
grep -q "calibration for micro-batch 2 from" "$WORK/again.err" || { cat "$WORK/again.err"; fail "the calibration was not reused"; }
grep -q "matching --only attn\[0-9\]" "$WORK/again.out" || fail "--only not reported: $(head -1 "$WORK/again.out")"
ranked=$(grep -cE "^ +[0-9]+  " "$WORK/again.out")
[[ $ranked -gt 0 && $(grep -E "^ +[0-9]+  " "$WORK/again.out" | grep -c "attn2") -eq $ranked ]] \
  || { cat "$WORK/again.out"; fail "--only 'attn[0-9]' ranked other layouts"; }
out=$("$BIN/hp-plan" "$WORK/c.yaml" --nproc 2 --only '(attn' 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"--only (attn: not a regular expression"* ]] || fail "bad --only: exit $rc: $out"
echo PASS
