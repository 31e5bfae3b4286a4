#!/usr/bin/env bash
# zb_h1 and zbv against 1f1b (figures printed, never asserted): the GPT at
# LAYERS x HIDDEN (default 12 x 768, GPT-2 small), pp=2 with 4 micro-batches
# of one sample (2 processes x 1 thread), with and without recompute: the
# measured idle fraction (pipeline_idle_fraction: time a stage waits on
# stage messages / step time, mean of the two stages), the median step
# time after the first two steps, and each stage's peak resident memory
# above its start (peaks.json: the model state is the same in both
# schedules, so the difference is what the schedule holds);
# beside them the simulator's idle for the same P and M with equal F, B, W
# and for the costs the run planned from (pipeline_idle_fraction_simulated:
# zb_h1 and zbv re-plan from step 3's measured F, B and W).
#   bash bench/bench_zero_bubble.sh [layers=12] [hidden=768] [steps=8]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
L=${1:-12}; H=${2:-768}; STEPS=${3:-8}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: 12, seq_len: 128}
data: {type: text}
training: {max_steps: $STEPS, global_batch_size: 4, micro_batch_size: 1, log_interval: 1, eval_interval: 0}
optimizer: {lr: 0.0003, schedule: constant}
checkpoint: {interval: 0, resume: never}
features:
  pipeline_parallel: {enabled: true, size: 2}
YAML
for rc in false true; do
  for s in 1f1b zb_h1 zbv; do
    name=${s}_rc$rc
    "$BIN/hp-train" "$W/c.yaml" --nproc 2 --threads-per-worker 1 --set features.pipeline_parallel.schedule=$s \
      --set features.recompute.enabled=$rc --set run.output_dir="$W/$name" > "$W/$name.log" 2>&1 \
      || { cat "$W/$name.log"; exit 1; }
  done
done
echo "GPT $L x $H, seq 128, pp=2, 4 micro-batches of 1 sample, 2 processes x 1 thread, $STEPS steps"
python3 - "$W" <<'PY'
import json, statistics, sys
w = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if '"step"' in l]
def fig(name, key):
    return statistics.median(r[key] for r in rows(name)[2:])
print(f"{'schedule':8s} {'recompute':9s} {'idle measured':>13s} {'sim. F=B=W':>14s} {'sim. planned':>14s} {'step s':>8s} "
      f"{'peak above start MiB (largest stage)':>36s}")
for rc in ("false", "true"):
    base = None
    for s in ("1f1b", "zb_h1", "zbv"):
        n = f"{s}_rc{rc}"
        idle = statistics.mean([fig(n, "pipeline_idle_fraction_stage0"), fig(n, "pipeline_idle_fraction_stage1")])
        step = fig(n, "step_seconds")
        p = json.load(open(f"{w}/{n}/peaks.json"))
        mem = max((a - b) / 2**20 for a, b in zip(p["peak_resident_memory_bytes"], p["start_resident_memory_bytes"]))
        theory = {"1f1b": "20.0 %", "zb_h1": "7.7 %", "zbv": "4.0 %"}[s]
        planned = fig(n, "pipeline_idle_fraction_simulated")
        costs = "" if s == "1f1b" else f"  (plan from step 3: B {fig(n, 'pipeline_plan_b_over_f'):.2f} F, W {fig(n, 'pipeline_plan_w_over_f'):.2f} F)"
        print(f"{s:8s} {rc:9s} {100 * idle:12.1f}% {theory:>14s} {100 * planned:13.1f}% {step:8.3f} {mem:36.1f}{costs}")
        if base is None:
            base = (idle, step, mem)
        else:
            print(f"  {s} / 1f1b: idle {idle / base[0]:.2f}x, step {100 * (step / base[1] - 1):+.1f} %, "
                  f"peak memory {mem - base[2]:+.1f} MiB ({mem / base[2]:.3f}x)")
PY
