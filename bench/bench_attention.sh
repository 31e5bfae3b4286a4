#!/usr/bin/env bash
# Eager against block attention (model.attention) in the 4 x 256 GPT (4
# heads): step time and peak resident memory (VmHWM, the
# peak_resident_memory_bytes of metrics.jsonl) at each sequence length, at
# about 4096 tokens per step (one micro-batch), 1 process x THREADS
# threads (default 2), synthetic data. Beside them PyTorch (Debian's python3-torch) running the
# same model with eager attention, when python3 can import torch. Figures
# are printed, never asserted. Eager at seq 4096 needs about 1 GiB of scores
# per layer at batch 1: do not run it beside anything.
#   bash bench/bench_attention.sh [steps=3] [seqs="512 1024 2048"] [block=128] [threads=2] [reps=1] [batch]
# reps > 1 alternates eager and block runs that many times per seq and prints
# the median over the runs of each one's mean steady step (on a shared
# machine the load moves between runs); peaks are the largest. batch, when
# given, fixes the batch at every seq instead of ~4096 tokens per step.
# HP_BENCH_PYTORCH=0 skips the PyTorch run.
# On a machine that other jobs load, use threads=1: with 2 threads every
# small matmul waits for a descheduled OpenMP thread (measured: a
# [32, 128, 64] x [32, 64, 128] bmm took 1.1 s at 2 threads and 10 ms at 1
# under load 13 on 2 cores, python3-torch), which hits block attention's many small calls
# hardest.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
STEPS=${1:-3}
SEQS=${2:-512 1024 2048}
BLOCK=${3:-128}
THREADS=${4:-2}
REPS=${5:-1}
BATCH=${6:-}
H=256; L=4; HEADS=4; TOKENS=4096
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
echo "GPT $L x $H, $HEADS heads, ~$TOKENS tokens per step, block $BLOCK, $THREADS thread(s)"
printf '%-8s %-6s %-10s %10s %12s\n' seq batch attention "step s" "peak MiB"
for T in $SEQS; do
  B=$(( TOKENS / T > 0 ? TOKENS / T : 1 ))
  [[ -n "$BATCH" ]] && B=$BATCH
  cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: $HEADS, seq_len: $T, vocab_size: 256}
data: {type: synthetic}
training: {max_steps: $STEPS, global_batch_size: $B, micro_batch_size: $B, log_interval: 1}
optimizer: {lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
  for ((rep = 0; rep < REPS; rep++)); do
    for A in eager block; do
      HP_INTRA_OP_THREADS=$THREADS "$BIN/hp-train" "$W/c.yaml" --set model.attention=$A \
        --set model.attention_block="$BLOCK" --set run.output_dir="$W/run_${T}_${A}_$rep" > "$W/$T$A.log" 2>&1 \
        || { cat "$W/$T$A.log"; exit 1; }
    done
  done
  for A in eager block; do
    python3 - "$T" "$B" "$A" "$W/run_${T}_${A}_"* <<'PY'
import json, statistics, sys
steps, peaks = [], []
for d in sys.argv[4:]:
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if l.strip()]
    steady = rows[1:] or rows  # the first step warms up
    steps.append(sum(r["step_seconds"] for r in steady) / len(steady))
    peaks.append(max(r["peak_resident_memory_bytes"] for r in rows))
runs = " ".join(f"{x:.2f}" for x in steps) if len(steps) > 1 else ""
print(f"{sys.argv[1]:8s} {sys.argv[2]:6s} {sys.argv[3]:10s} {statistics.median(steps):10.3f} {max(peaks) / 2**20:12.0f}  {runs}")
PY
  done
  if [[ ${HP_BENCH_PYTORCH:-1} == 0 ]]; then
    :
  elif /usr/bin/python3 -c "import torch" 2>/dev/null; then
    /usr/bin/python3 - "$T" "$B" "$STEPS" "$H" "$L" "$HEADS" "$THREADS" <<'PY'
# The same GPT in PyTorch: pre-LayerNorm blocks, fused qkv, GELU MLP (4 h),
# learned positions, untied head, AdamW; eager attention (scores [B, h, T, T]).
import math, resource, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F
T, B, steps, H, L, heads, threads = map(int, sys.argv[1:])
torch.set_num_threads(threads)
torch.manual_seed(0)
V = 256
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1), persistent=False)
    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, heads, 3, H // heads).unbind(3)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(H // heads)
        a = F.softmax(s.masked_fill(self.mask, float("-inf")), -1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, H))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, H), nn.Parameter(torch.randn(T, H) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln, self.out = nn.LayerNorm(H), nn.Linear(H, V, bias=False)
    def forward(self, ids):
        x = self.tok(ids) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.out(self.ln(x))
model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
times = []
for step in range(steps):
    ids = torch.randint(0, V, (B, T + 1))
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(ids[:, :-1]).reshape(-1, V), ids[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - t0)
steady = times[1:] or times
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(f"{T:<8d} {B:<6d} {'pytorch':10s} {sum(steady) / len(steady):10.3f} {peak / 2**20:12.0f}")
PY
  else
    echo "$T pytorch: not measured (/usr/bin/python3 cannot import torch; apt-get install python3-torch)"
  fi
done
