#!/usr/bin/env bash
# Tensor parallel side by side in one run (figures printed, never asserted):
# tokens/s of tp=2 (2 processes x 1 thread) beside 1 process x 1 thread and
# 1 process x 2 threads on the same GPT; payload bytes communicated per step
# beside the theory; peak memory per rank.
#   bash bench/bench_tensor_parallel.sh [hidden=512] [steps=12]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
H=${1:-512}; STEPS=${2:-12}
L=4; T=128; B=8; M=8
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: 8, seq_len: $T}
data: {type: text}
training: {max_steps: $STEPS, global_batch_size: $B, micro_batch_size: $M, log_interval: 1}
optimizer: {lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
run() {  # name, env, args...
  local name=$1 envs=$2; shift 2
  env $envs "$BIN/hp-train" "$W/c.yaml" --set run.output_dir="$W/$name" "$@" > "$W/$name.log" 2>&1 \
    || { cat "$W/$name.log"; exit 1; }
}
run one_thread "HP_INTRA_OP_THREADS=1"
run two_threads "HP_INTRA_OP_THREADS=2"
run tp2 "" --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
run tp2sp "" --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set features.tensor_parallel.sequence_parallel=true
python3 - "$W" "$H" "$L" "$T" "$B" <<'PY'
import json, sys
w, H, L, T, B = sys.argv[1], *map(int, sys.argv[2:])
def rows(name):
    r = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()]
    return r[1:]  # the first step warms up
def tps(name):
    r = rows(name)
    return sum(x["tokens_per_second"] for x in r) / len(r)
theory = 4 * L * B * T * H * 4  # 2 all-reduces forward + 2 backward per layer, fp32 payload
tp = rows("tp2")
measured = sum(x["comm_bytes"] for x in tp) / len(tp)
print(f"GPT {L} layers x {H} wide, seq {T}, batch {B}; rank 0 figures for tp=2")
print(f"{'run':36s} {'tokens/s':>10s} {'vs 1 thread':>12s} {'peak RSS MB':>12s} {'comm s/step':>12s} {'step s':>8s}")
base = tps("one_thread")
for name, label in [("one_thread", "1 process x 1 thread"), ("two_threads", "1 process x 2 threads"),
                    ("tp2", "tp=2: 2 processes x 1 thread"), ("tp2sp", "tp=2 + sequence parallel")]:
    r = rows(name)
    peak = max(x["peak_resident_memory_bytes"] for x in r) / 2**20
    comm = sum(x.get("comm_seconds", 0) for x in r) / len(r)
    step = sum(x["step_seconds"] for x in r) / len(r)
    print(f"{label:36s} {tps(name):10.0f} {tps(name)/base:11.2f}x {peak:12.1f} {comm:12.3f} {step:8.3f}")
print(f"tp=2 payload bytes per step (rank 0, all groups): {measured/2**20:.2f} MiB; "
      f"theory (4 all-reduces of batch x seq x hidden per layer): {theory/2**20:.2f} MiB; "
      f"ratio {measured/theory:.2f} (embedding/head all-reduces and the loss's small ones come on top)")
PY
