#!/usr/bin/env bash
# Two builds side by side in one run (figures printed, never asserted): the
# step time and training peak of the same configurations under build A and
# build B, interleaved (A B A B ...), for checking that a change is not
# slower: plain data parallel and ZeRO stage 3 at dp=2 (2 processes x 1
# thread) on the 12 x 768 GPT (seq 128, global batch 8 in micro-batches of
# 2, AdamW, the fortunes corpus), each variant REPS times; per run the
# median step time after the first two steps, then per variant and build the
# median over runs, and B / A.
#   bash bench/bench_builds.sh BIN_A BIN_B [reps=2] [steps=7]
# BENCH_VARIANTS: which of "plain zero3" to run (default both).
# BIN_A, BIN_B: bin/ folders of two build trees (each finds its own plugins),
# e.g. a worktree of an earlier commit built with scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?usage: bench_builds.sh BIN_A BIN_B [reps] [steps]}; B=${2:?usage: bench_builds.sh BIN_A BIN_B [reps] [steps]}
REPS=${3:-2}; STEPS=${4:-7}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: 12, hidden: 768, heads: 12, seq_len: 128}
data: {type: text}
training: {max_steps: $STEPS, global_batch_size: 8, micro_batch_size: 2, log_interval: 1, eval_interval: 0}
optimizer: {type: adamw, lr: 0.001, schedule: constant, grad_clip: 1.0}
checkpoint: {interval: 0, resume: never}
YAML
declare -A VARIANT=([plain]="" [zero3]="--set features.zero.enabled=true --set features.zero.stage=3")
echo "A: $A"; echo "B: $B"; echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
VARIANTS=${BENCH_VARIANTS:-plain zero3}
for r in $(seq 1 "$REPS"); do
  for v in $VARIANTS; do
    for b in A B; do
      bin=$A; [[ $b == B ]] && bin=$B
      # shellcheck disable=SC2086
      "$bin/hp-train" "$W/c.yaml" --nproc 2 ${VARIANT[$v]} --set run.output_dir="$W/${v}_${b}_$r" \
        > "$W/${v}_${b}_$r.log" 2>&1 || { tail -20 "$W/${v}_${b}_$r.log"; exit 1; }
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$W" "$REPS" "$VARIANTS" <<'PY'
import json, statistics, sys
w, reps = sys.argv[1], int(sys.argv[2])
def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip() and "step_seconds" in l]
print("12 x 768 GPT, dp=2: median step seconds (steps 3..) per run, median; training peak MiB (rank 0)")
for v in sys.argv[3].split():
    med = {}
    for b in ("A", "B"):
        per = [statistics.median(r["step_seconds"] for r in rows(f"{v}_{b}_{k}")[2:]) for k in range(1, reps + 1)]
        peak = max(max(r.get("peak_resident_memory_bytes", 0) for r in rows(f"{v}_{b}_{k}")) for k in range(1, reps + 1))
        med[b] = statistics.median(per)
        print(f"{v:>6s} {b}: {' '.join(f'{x:.3f}' for x in per)}  median {med[b]:.3f} s, peak {peak / 2**20:.0f} MiB")
    print(f"{v:>6s} B / A: {med['B'] / med['A']:.3f}")
PY
