#!/usr/bin/env bash
# The flight recorder's cost and reaction time, printed, never asserted:
# step time with recording on against off on the 4 x 256 GPT at dp=2 and
# pp=2 (each pair run twice, interleaved, to even out drift), and the time
# from a SIGSTOP of one rank to the message naming it (stall_seconds 2).
#   bash bench/bench_flight.sh [steps=40]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
STEPS=${1:-40}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
source bench/lib.sh
bench_gpt_config "$W/c.yaml" "$STEPS"
pp=(--set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2)
for round in 1 2; do
  for rec in false true; do
    "$BIN/hp-train" "$W/c.yaml" --nproc 2 --set distributed.flight_recorder=$rec \
      --set run.output_dir="$W/dp2_${rec}_$round" > "$W/log" 2>&1 || { cat "$W/log"; exit 1; }
    "$BIN/hp-train" "$W/c.yaml" --nproc 2 "${pp[@]}" --set distributed.flight_recorder=$rec \
      --set run.output_dir="$W/pp2_${rec}_$round" > "$W/log" 2>&1 || { cat "$W/log"; exit 1; }
  done
done
# Reaction time: a long dp=2 run, rank 1 stopped, the report timed.
"$BIN/hp-train" "$W/c.yaml" --nproc 2 --set training.max_steps=100000 --set distributed.stall_seconds=2 \
  --set run.output_dir="$W/stall" > "$W/stall.log" 2>&1 &
pid=$!
while [[ ! -f "$W/stall/metrics.jsonl" ]] || (( $(wc -l < "$W/stall/metrics.jsonl") < 5 )); do sleep 0.1; done
victim=$(worker_pid "$W/stall.log" 1)
t0=$(date +%s.%N); kill -STOP "$victim"
until grep -q "stall on group" "$W/stall.log"; do sleep 0.05; done
t1=$(date +%s.%N)
kill -CONT "$victim"; kill $pid; wait $pid || true
ops=$("$BIN/hp-bench-flight-ops")
python3 - "$W" "$t0" "$t1" "$(grep -m1 'stall on group' "$W/stall.log")" "$ops" <<'PY'
import json, re, sys
w, t0, t1, line, ops = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
def step(name):
    r = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()][1:]  # step 1 warms up
    return sum(x["step_seconds"] for x in r) / len(r)
print("GPT 4 layers x 256 wide, seq 128, batch 8 (4 micro-batches of 2); 2 processes x 1 thread")
print(f"{'layout':8s} {'recording off s':>16s} {'on s':>10s} {'on vs off':>10s}")
for lay in ("dp2", "pp2"):
    off = sum(step(f"{lay}_false_{r}") for r in (1, 2)) / 2
    on = sum(step(f"{lay}_true_{r}") for r in (1, 2)) / 2
    print(f"{lay:8s} {off:16.4f} {on:10.4f} {100 * (on / off - 1):+9.2f}%")
# The recorder's own cost: operations recorded per step (from the stall
# run's rank-0 heartbeat) times the measured cost of one.
ns = float(re.search(r"([0-9.]+) ns per recorded operation", ops).group(1))
hb = json.load(open(f"{w}/stall/flight/heartbeat-rank00000.json"))
steps = hb["action"]["step"] + 1
n = sum(g["issued"] + sum(g["sent"].values()) + sum(g["received"].values()) for g in hb["groups"].values())
off = sum(step(f"dp2_false_{r}") for r in (1, 2)) / 2
print(ops)
print(f"dp=2: {n / steps:.1f} recorded operations per step x {ns:.0f} ns = {n / steps * ns / 1e3:.1f} us per step "
      f"= {100 * n / steps * ns / 1e9 / off:.4f}% of a {off:.3f} s step")
print(f"SIGSTOP of rank 1 to the report: {t1 - t0:.2f} s (stall_seconds 2):")
print("  " + line.split("] ", 3)[-1])
PY
