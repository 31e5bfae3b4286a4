#!/usr/bin/env bash
# Generation with and without the key/value cache, and decode at two ranks.
# A byte-level GPT (6 x 512, 8 heads, seq_len 576) trained 2 steps on a
# fortune file (speed does not depend on what it learned) continues
# 512-byte prompts by 32 greedy tokens. Per run: the prefill's seconds, the
# decode milliseconds per step (every step after the first), decode tokens/s
# (requests x steps / seconds), the bytes rank 0 sent per decode step and
# the cache's bytes per token on rank 0. Runs, side by side:
#   one process x 2 threads: 1 request with the cache, then without it
#     (every step recomputes the whole context: the baseline of the >= 5x
#     target), and 2 requests with the cache;
#   2 processes x 1 thread: attention tp=2 (1 and 2 requests), and dp=2
#     (2 requests, one per replica).
# Printed, never asserted.
#   bash bench/bench_generate.sh [new_tokens=32]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
NEW=${1:-32}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
CORPUS=/usr/share/games/fortunes/computers
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: 6, hidden: 512, heads: 8, seq_len: 576, vocab_size: 256, dropout: 0}
data: {type: text, path: $CORPUS}
training: {max_steps: 2, global_batch_size: 2, micro_batch_size: 1, log_interval: 1, eval_interval: 0}
optimizer: {lr: 0.001, schedule: constant}
checkpoint: {interval: 2}
YAML
"$BIN/hp-train" "$W/c.yaml" --set run.output_dir="$W/train" > "$W/train.log" 2>&1 || { tail "$W/train.log"; exit 1; }
python3 - "$CORPUS" "$W" <<'PY'
import sys
text = " ".join(open(sys.argv[1], encoding="latin-1").read().split())
open(sys.argv[2] + "/one.txt", "w").write(text[:512] + "\n")
open(sys.argv[2] + "/two.txt", "w").write(text[:512] + "\n" + text[1000:1512] + "\n")
PY
echo "GPT 6 x 512 (8 heads), seq_len 576, byte tokens; prompts of 512 tokens, $NEW new tokens, greedy"
printf '%-34s %9s %11s %10s %14s %12s\n' run "prefill s" "decode ms" "tokens/s" "bytes/step r0" "kv B/token"
one() {  # NAME PROMPTS ENV ARGS...
  local name=$1 prompts=$2 env=$3
  shift 3
  env $env "$BIN/hp-generate" "$W/train/checkpoints" --prompts "$W/$prompts" --max-new-tokens "$NEW" --greedy \
    --out "$W/$name" "$@" > "$W/$name.out" 2> "$W/$name.err" || { tail "$W/$name.err"; exit 1; }
  python3 - "$W/$name/generate.json" "$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
steps, req = j["decode_steps"], len(j["tokens"])
ms = 1e3 * j["decode_seconds"] / max(steps, 1)
print("%-34s %9.3f %11.1f %10.1f %14.0f %12d" % (sys.argv[2], j["prefill_seconds"], ms, req * steps / j["decode_seconds"],
      j["decode_bytes"] / max(steps, 1), j["kv_cache"]["bytes_per_token"]))
open(sys.argv[1] + ".ms", "w").write("%f" % ms)
PY
}
one "1 proc x 2 threads, cache"       one.txt "HP_INTRA_OP_THREADS=2"
one "1 proc x 2 threads, no cache"    one.txt "HP_INTRA_OP_THREADS=2" --no-kv-cache
one "1 proc x 2 threads, 2 requests"  two.txt "HP_INTRA_OP_THREADS=2"
one "attn tp=2 (2 x 1 thread)"        one.txt "" --nproc 2 --threads-per-worker 1 \
  --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
one "attn tp=2, 2 requests"           two.txt "" --nproc 2 --threads-per-worker 1 \
  --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
one "attn dp=2, 2 requests"           two.txt "" --nproc 2 --threads-per-worker 1
python3 - "$W" <<'PY'
import sys
w = sys.argv[1]
c = float(open(w + "/1 proc x 2 threads, cache/generate.json.ms").read())
n = float(open(w + "/1 proc x 2 threads, no cache/generate.json.ms").read())
print("decode at a 512-token context: %.1f ms per token with the cache, %.1f without: %.1fx" % (c, n, n / c))
PY
