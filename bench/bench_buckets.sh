#!/usr/bin/env bash
# The gradient buckets rebuilt in arrival order (distributed.rebuild_buckets)
# against the declared order, side by side in one run (figures printed,
# never asserted): plain data parallel at dp=2 (2 processes x 1 thread) on
# the 12 x 768 GPT (seq 128, global batch 8 in micro-batches of 2, AdamW,
# the fortunes corpus), distributed.overlap on, each variant REPS times,
# interleaved (A B A B ...); per run the median step time over the steps
# after the first two (the first counts gradients, the second runs on the
# rebuilt buckets), then per variant the median over runs. Also printed:
# buckets, buckets launched during backward, and whether the buckets were
# rebuilt (metrics.jsonl).
#   bash bench/bench_buckets.sh [reps=3] [steps=8] [layers=12] [hidden=768]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${HP_BIN:-build/bin}
REPS=${1:-3}; STEPS=${2:-8}; L=${3:-12}; H=${4:-768}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: 12, seq_len: 128}
data: {type: text}
training: {max_steps: $STEPS, global_batch_size: 8, micro_batch_size: 2, log_interval: 1, eval_interval: 0}
optimizer: {type: adamw, lr: 0.001, schedule: constant, grad_clip: 1.0}
checkpoint: {interval: 0, resume: never}
YAML
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$REPS"); do
  for v in declared rebuilt; do
    flag=false; [[ $v == rebuilt ]] && flag=true
    "$BIN/hp-train" "$W/c.yaml" --nproc 2 --set distributed.overlap=true --set distributed.rebuild_buckets=$flag \
      --set run.output_dir="$W/${v}_$r" > "$W/${v}_$r.log" 2>&1 || { cat "$W/${v}_$r.log"; exit 1; }
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$W" "$REPS" "$L" "$H" <<'PY'
import json, statistics, sys
w, reps, L, H = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip() and "step_seconds" in l]
print(f"GPT {L} x {H}, dp=2 (2 processes x 1 thread), overlap on; median step seconds (steps 3..), per run and overall")
out = {}
for v in ("declared", "rebuilt"):
    per = [statistics.median(r["step_seconds"] for r in rows(f"{v}_{k}")[2:]) for k in range(1, reps + 1)]
    last = rows(f"{v}_1")[-1]
    out[v] = statistics.median(per)
    print(f"{v:>9s}: {' '.join(f'{x:.3f}' for x in per)}  median {out[v]:.3f} s; buckets {last.get('grad_buckets', 0):.0f}, "
          f"launched during backward {last.get('grad_buckets_early', 0):.0f}, rebuilt {last.get('grad_buckets_rebuilt', 0):.0f}")
print(f"rebuilt / declared: {out['rebuilt'] / out['declared']:.3f}")
PY
