#!/usr/bin/env bash
# Context parallel against one process x 2 threads and against tp=2 on the
# 4 x 256 GPT (4 heads) at long sequences: step time, tokens/s and peak
# resident memory of rank 0 (VmHWM; cp ranks hold equal shares) and what
# of it the sequence added (peak minus the same layout's peak at seq 256:
# activations, whose attention part is what cp divides), ring bytes
# sent per step against the RFC's theory, and the share of the ring's
# message time hidden behind block compute (1 - waited / in flight, from
# the cp_ring_* and comm_seconds_cp_recv figures). One process and tp=2 use
# block attention (model.attention: block), the one-process path at these
# lengths; cp=2 uses ring attention. Every run has 2 cores: 1 process x 2
# intra-op threads, or 2 processes x 1. Printed, never asserted.
#   bash bench/bench_context_parallel.sh [steps=4] [seqs="2048 4096"] [batch=2] [reps=1]
# reps > 1 alternates the layouts that many times and prints the median of
# each one's mean steady step (the first step warms up).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
STEPS=${1:-4}
SEQS=${2:-2048 4096}
BATCH=${3:-2}
REPS=${4:-1}
H=256; L=4; HEADS=4
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
echo "GPT $L x $H, $HEADS heads, batch $BATCH (one micro-batch), synthetic data, $STEPS steps (first not timed)"
printf '%-6s %-22s %9s %10s %9s %9s %12s %12s %8s\n' seq layout "step s" "tokens/s" "peak MiB" "seq MiB" "ring MB/step" "theory MB" hidden
config() {  # SEQ STEPS
  cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: $HEADS, seq_len: $1, vocab_size: 256, attention: block}
data: {type: synthetic}
training: {max_steps: $2, global_batch_size: $BATCH, micro_batch_size: $BATCH, log_interval: 1}
optimizer: {lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
}
layouts() {  # TAG: one run of each layout
  HP_INTRA_OP_THREADS=2 "$BIN/hp-train" "$W/c.yaml" --set run.output_dir="$W/one_$1" > "$W/log" 2>&1 \
    || { tail -20 "$W/log"; exit 1; }
  "$BIN/hp-train" "$W/c.yaml" --nproc 2 --set features.context_parallel.enabled=true \
    --set run.output_dir="$W/cp2_$1" > "$W/log" 2>&1 || { tail -20 "$W/log"; exit 1; }
  "$BIN/hp-train" "$W/c.yaml" --nproc 2 --set features.tensor_parallel.enabled=true \
    --set run.output_dir="$W/tp2_$1" > "$W/log" 2>&1 || { tail -20 "$W/log"; exit 1; }
}
# The baseline: weights, optimizer state, libraries and a 256-position step.
config 256 2
layouts base
for T in $SEQS; do
  config "$T" "$STEPS"
  for ((rep = 0; rep < REPS; rep++)); do layouts "${T}_$rep"; done
  for lay in one cp2 tp2; do
    python3 - "$T" "$lay" "$BATCH" "$H" "$L" "$W/${lay}_base" "$W/${lay}_${T}_"* <<'PY'
import json, statistics, sys
T, lay, B, H, L = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
base = max(json.loads(l)["peak_resident_memory_bytes"] for l in open(sys.argv[6] + "/metrics.jsonl") if l.strip())
names = {"one": "1 process x 2 threads", "cp2": "cp=2 (ring)", "tp2": "tp=2"}
steps, peaks, sent, hidden = [], [], [], []
for d in sys.argv[7:]:
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if l.strip()]
    steady = rows[1:] or rows
    steps.append(sum(r["step_seconds"] for r in steady) / len(steady))
    peaks.append(max(r["peak_resident_memory_bytes"] for r in rows))
    if lay == "cp2":
        sent.append(statistics.mean(r["comm_bytes_cp_send"] for r in steady))
        flight = sum(r["comm_seconds_cp_recv"] for r in steady)
        waited = sum(r["cp_ring_wait_seconds"] for r in steady)
        hidden.append(1 - waited / flight if flight > 0 else float("nan"))
step = statistics.median(steps)
# Ring bytes per step and rank at cp = 2 (RFC 0012 section 6.4): per layer,
# forward (cp - 1) key/value messages, backward (cp - 1) more and cp
# gradient messages; each is k and v of the local positions, 2 B (T / cp) H fp32.
cp = 2
theory = L * (3 * cp - 2) * 2 * B * (T // cp) * H * 4
ring = f"{statistics.mean(sent) / 1e6:12.1f} {theory / 1e6:12.1f} {statistics.median(hidden):8.2f}" if sent else f"{'':12s} {'':12s} {'':8s}"
print(f"{T:<6d} {names[lay]:22s} {step:9.3f} {B * T / step:10.0f} {max(peaks) / 2**20:9.0f} {(max(peaks) - base) / 2**20:9.0f} {ring}")
PY
  done
done
