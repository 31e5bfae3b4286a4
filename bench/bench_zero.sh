#!/usr/bin/env bash
# zero (ZeRO-1) side by side in one run (figures printed, never asserted):
# optimizer-state bytes and peak resident memory per rank at dp = 1, 2, 4
# with and without zero, and step time beside plain data parallel.
#   bash bench/bench_zero.sh [hidden=256] [steps=12]
# Each rank gets cores / ranks intra-op threads (hp-launch), so dp=4 on this
# 2-core machine runs 4 single-thread processes on 2 cores: its step times
# say little; its bytes are exact.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
H=${1:-256}; STEPS=${2:-12}
L=4; T=128; B=8; M=2
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: 4, seq_len: $T}
data: {type: text}
training: {max_steps: $STEPS, global_batch_size: $B, micro_batch_size: $M, log_interval: 1}
optimizer: {type: adamw, lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
for dp in 1 2 4; do
  for z in false true; do
    name="dp${dp}_zero_$z"
    "$BIN/hp-train" "$W/c.yaml" --nproc "$dp" --set features.zero.enabled=$z --set run.output_dir="$W/$name" \
      > "$W/$name.log" 2>&1 || { cat "$W/$name.log"; exit 1; }
  done
done
# zero at dp=2 with the blocking path (distributed.overlap: false): the
# reduce-scatters after backward, the all-gathers inside the update.
"$BIN/hp-train" "$W/c.yaml" --nproc 2 --set features.zero.enabled=true --set distributed.overlap=false \
  --set run.output_dir="$W/dp2_zero_blocking" > "$W/dp2_zero_blocking.log" 2>&1 || { cat "$W/dp2_zero_blocking.log"; exit 1; }
python3 - "$W" "$H" "$L" "$T" "$B" <<'PY'
import json, re, sys
w, H, L, T, B = sys.argv[1], *map(int, sys.argv[2:])
def per_rank(name):
    out = {}
    for line in open(f"{w}/{name}.log"):
        m = re.search(r"\[rank (\d+)[^\]]*\].*this rank: optimizer state (\d+) bytes, peak resident memory ([\d.]+) MiB", line)
        if m:
            out[int(m.group(1))] = (int(m.group(2)), float(m.group(3)))
    return out
def step_seconds(name):
    r = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()][1:]  # step 1 warms up
    return sum(x["step_seconds"] for x in r) / len(r)
print(f"GPT {L} layers x {H} wide, seq {T}, global batch {B}, AdamW (2 state tensors per parameter)")
print(f"{'dp':>3s} {'zero':>5s} {'state bytes/rank (each rank)':>44s} {'vs unsharded/dp':>16s} "
      f"{'peak RSS MiB/rank':>26s} {'step s':>8s}")
base = per_rank("dp1_zero_false")[0][0]
for dp in (1, 2, 4):
    for z in ("false", "true"):
        name = f"dp{dp}_zero_{z}"
        r = per_rank(name)
        states = [r[k][0] for k in sorted(r)]
        rss = [r[k][1] for k in sorted(r)]
        target = base / dp if z == "true" else base
        worst = max(abs(s / target - 1) for s in states)
        print(f"{dp:3d} {z:>5s} {' '.join(str(s) for s in states):>44s} {'±%.2f%%' % (100 * worst):>16s} "
              f"{' '.join('%.0f' % x for x in rss):>26s} {step_seconds(name):8.3f}")
for dp in (2, 4):
    a, b = step_seconds(f"dp{dp}_zero_false"), step_seconds(f"dp{dp}_zero_true")
    print(f"dp={dp}: step time with zero {b:.3f} s vs plain {a:.3f} s ({100 * (b / a - 1):+.1f}%)")
def mean_of(name, key):
    r = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()][1:]
    return sum(x.get(key, 0) for x in r) / len(r)
on, off = step_seconds("dp2_zero_true"), step_seconds("dp2_zero_blocking")
print(f"dp=2 zero: overlap on {on:.3f} s vs off {off:.3f} s ({100 * (on / off - 1):+.1f}%); with it on, the forward "
      f"still waited {1000 * mean_of('dp2_zero_true', 'zero_gather_wait_seconds'):.2f} ms per step for "
      f"{mean_of('dp2_zero_true', 'zero_gathers'):.0f} parameter gathers")
PY
