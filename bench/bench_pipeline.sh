#!/usr/bin/env bash
# Pipeline schedules side by side (figures printed, never asserted):
#  - idle fraction per stage (time blocked on stage messages / step time),
#    measured, beside the theory (P-1)/(M+P-1) for gpipe and 1f1b and
#    (P-1)/(V M+P-1) for interleaved_1f1b (V = 2), for P = 2, 4 and M = 4, 8, 16;
#  - activation memory of the first stage, gpipe against 1f1b: the peak
#    resident-memory growth within a step (kernel peak mark reset at the step's
#    start; large allocations forced to mmap so freed tensors leave RSS), and
#    the most micro-batches held between forward and backward.
#   bash bench/bench_pipeline.sh [hidden=256] [steps=6]
# On a 2-core machine P = 4 runs 4 single-thread processes on 2 cores, so its
# idle figures include time a stage waits for a descheduled neighbour.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
H=${1:-256}; STEPS=${2:-6}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: 8, hidden: $H, heads: 4, seq_len: 128}
data: {type: text}
training: {max_steps: $STEPS, micro_batch_size: 1, log_interval: 1, eval_interval: 0}
optimizer: {lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
export HP_PIPELINE_MEMORY_PROBE=1 MALLOC_MMAP_THRESHOLD_=65536
for P in 2 4; do
  for M in 4 8 16; do
    for s in gpipe 1f1b interleaved_1f1b; do
      V=1; [[ $s == interleaved_1f1b ]] && V=2
      name=P${P}_M${M}_$s
      "$BIN/hp-train" "$W/c.yaml" --nproc $P --set training.global_batch_size=$M \
        --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=$P \
        --set features.pipeline_parallel.schedule=$s --set features.pipeline_parallel.virtual_stages=$V \
        --set run.output_dir="$W/$name" > "$W/$name.log" 2>&1 || { cat "$W/$name.log"; exit 1; }
    done
  done
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
def rows(name):
    r = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()]
    return r[1:]  # the first step warms up (and allocates the optimizer state)
def mean(name, key):
    r = rows(name)
    return sum(x[key] for x in r) / len(r)
print("Idle fraction per stage (time blocked on stage messages / step time), mean over steps 2..N")
print(f"{'P':>2} {'M':>3} {'schedule':18s} {'theory':>7s} {'measured per stage':40s} {'mean':>6s} {'mean-theory':>12s}")
for P in (2, 4):
    for M in (4, 8, 16):
        for s in ("gpipe", "1f1b", "interleaved_1f1b"):
            V = 2 if s == "interleaved_1f1b" else 1
            theory = (P - 1) / (V * M + P - 1)
            n = f"P{P}_M{M}_{s}"
            per = [mean(n, f"pipeline_idle_fraction_stage{k}") for k in range(P)]
            avg = sum(per) / P
            print(f"{P:>2} {M:>3} {s:18s} {theory:7.3f} {' '.join(f'{x:6.3f}' for x in per):40s} {avg:6.3f} {100*(avg-theory):+10.1f}pp")
print()
print("First stage's activation memory, gpipe against 1f1b (peak RSS growth within a step; micro-batches in flight)")
print(f"{'P':>2} {'M':>3} {'gpipe MB':>9s} {'1f1b MB':>8s} {'ratio':>6s} {'P/M':>6s} {'target 1.2 P/M':>15s} {'in flight gpipe/1f1b':>22s}")
for P in (2, 4):
    for M in (4, 8, 16):
        g = max(x["pipeline_step_memory_growth_bytes_stage0"] for x in rows(f"P{P}_M{M}_gpipe")) / 2**20
        o = max(x["pipeline_step_memory_growth_bytes_stage0"] for x in rows(f"P{P}_M{M}_1f1b")) / 2**20
        fg = max(x["pipeline_peak_in_flight_stage0"] for x in rows(f"P{P}_M{M}_gpipe"))
        fo = max(x["pipeline_peak_in_flight_stage0"] for x in rows(f"P{P}_M{M}_1f1b"))
        print(f"{P:>2} {M:>3} {g:9.1f} {o:8.1f} {o/g:6.3f} {P/M:6.3f} {1.2*P/M:15.3f} {int(fg):>12d}/{int(fo)}")
PY
