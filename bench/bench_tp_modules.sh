#!/usr/bin/env bash
# Per-module tensor-parallel degrees against uniform layouts on the same
# ranks, on a GPT where they should pay: a 32k vocabulary (synthetic data),
# so the embedding and the LM head are most of the weights and of the
# compute of a small 4 x 256 trunk. Per layout, rank 0's parameter bytes
# (AdamW holds two moments per parameter: optimizer state / 2), its peak
# resident memory (VmHWM), the median steady step's tokens/s, and the bytes
# each module's outer group moved per step beside docs/rfc/0013's table
# (section 6.4). Every run has the machine's 2 cores: ranks x 1 intra-op
# thread. Printed, never asserted.
# The fourth argument picks the model: gpt (default), or llama (the same
# 4 x 256 trunk as model.type: llama: 8 query and 4 key/value heads, SwiGLU
# of width 688, RMSNorm, rotary positions).
#   bash bench/bench_tp_modules.sh [steps=6] [ranks="2 4"] [vocab=32768] [model=gpt]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
STEPS=${1:-6}
RANKS=${2:-2 4}
V=${3:-32768}
MODEL=${4:-gpt}
H=256; L=4; HEADS=4; SEQ=128; MB=2
EXTRA=""
if [[ $MODEL == llama ]]; then HEADS=8; EXTRA=", kv_heads: 4, ffn_hidden: 688"; fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: $MODEL, layers: $L, hidden: $H, heads: $HEADS, seq_len: $SEQ, vocab_size: $V$EXTRA}
data: {type: synthetic}
training: {max_steps: $STEPS, global_batch_size: 8, micro_batch_size: $MB, log_interval: 1}
optimizer: {lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
P=features.tensor_parallel
echo "$MODEL $L x $H, $HEADS heads${EXTRA:+ ($EXTRA)}, seq $SEQ, vocabulary $V, global batch 8 (micro $MB), synthetic data, $STEPS steps (first not timed)"
printf '%-5s %-44s %10s %9s %10s  %s\n' ranks layout "param MiB" "peak MiB" "tokens/s" "outer-group bytes per step (table)"
one() {  # NPROC NAME ARGS...
  local n=$1 name=$2
  shift 2
  "$BIN/hp-train" "$W/c.yaml" --nproc "$n" --set run.output_dir="$W/$name" "$@" > "$W/$name.log" 2>&1 \
    || { tail -20 "$W/$name.log"; exit 1; }
  python3 - "$W/$name" "$n" "$name" "$H" "$L" "$SEQ" "$MB" <<'PY'
import json, re, statistics, sys
d, n, name, h, layers, seq, mb = sys.argv[1], int(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:])
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if l.strip()]
steady = rows[1:] or rows
tps = statistics.median(r["tokens_per_second"] for r in steady)
peak = max(r["peak_resident_memory_bytes"] for r in rows) / 2**20
params = rows[-1]["optimizer_state_bytes"] / 2 / 2**20
# docs/rfc/0013 section 6.4: per micro-batch of t own tokens, a module at
# degree T x M sends through its outer group (M - 1) x 4ht in gathers and
# as much in reduce-scatters each way per use (attention and FFN: one use
# per layer); the embedding adds its 8t token ids to the gather and has no
# input gradient; the LM head adds its 8t targets.
t = mb * seq
m = re.search(r"mesh (.*?) over", open(d + ".log").read())
mesh = dict(kv.split("=") for kv in m.group(1).split())
micro = 8 // mb // int(mesh.get("dp", 1))  # micro-batches per step on a rank
table = {"attn": lambda: 2 * layers * 4 * h * t, "ffn": lambda: 2 * layers * 4 * h * t,
         "embed": lambda: (8 * t + 4 * h * t, 4 * h * t), "head": lambda: (4 * h * t + 8 * t, 4 * h * t)}
out = []
for k, f in table.items():
    ag, rs = rows[1].get("comm_bytes_%s_tp_outer_all_gather" % k), rows[1].get("comm_bytes_%s_tp_outer_reduce_scatter" % k)
    if ag is None: continue
    want = f()
    want = want if isinstance(want, tuple) else (want, want)
    M = int(mesh["%s_tp_outer" % k])
    out.append("%s %.2f/%.2f MB (%.2f/%.2f)" % (k, ag / 1e6, rs / 1e6, (M - 1) * micro * want[0] / 1e6,
                                               (M - 1) * micro * want[1] / 1e6))
print("%-5d %-44s %10.1f %9.0f %10.0f  %s" % (n, name, params, peak, tps, "; ".join(out) or "-"))
PY
}
for n in $RANKS; do
  one "$n" "dp$n" --set $P.enabled=false
  one "$n" "tp$n" --set $P.enabled=true --set $P.size="$n"
  if [[ $n -ge 4 ]]; then
    one "$n" "tp2_dp$((n / 2))" --set $P.enabled=true --set $P.size=2
    one "$n" "attn1_ffn2_embed${n}_head${n}" --set $P.enabled=true --set $P.size=1 --set $P.ffn_size=2 \
      --set $P.embedding_size="$n" --set $P.lm_head_size="$n"
  fi
  one "$n" "attn1_ffn1_embed${n}_head${n}" --set $P.enabled=true --set $P.size=1 --set $P.embedding_size="$n" \
    --set $P.lm_head_size="$n"
done
