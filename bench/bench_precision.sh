#!/usr/bin/env bash
# fp32 against bf16 mixed precision side by side in one run (figures
# printed, never asserted; docs/rfc/0014-mixed-precision.md):
#  1. the GPT-2-small shape (12 x 768, 12 heads, seq 128, global batch 16 in
#     micro-batches of 4, byte tokens of the fortunes corpus) at 1 process x
#     2 threads and at dp=2 (2 x 1): hp fp32, hp bf16 (and at dp=2 bf16 with
#     bf16 gradient sums), and PyTorch 1.13 on the same model and batch
#     (bench/pytorch_gpt_ddp.py, fp32 and CPU autocast to bf16, DDP at dp=2);
#     the fp32 side again with OPENBLAS_CORETYPE=Haswell. Per variant:
#     tokens/s (median of the steps after the warm-up), activation memory
#     (rank 0's peak resident memory minus its resident memory after setup)
#     and, for hp, bytes per step per group and operation;
#  2. bytes per step of every group at tp=2, pp=2, ep=2, cp=2 and zero-3
#     dp=2 (4 x 256), fp32 against bf16, with the ratio (the formula: bf16
#     moves 2 bytes an element where fp32 moves 4, so 0.5 where activations
#     or weights move; gradient sums stay fp32 unless reduce_dtype: bf16);
#  3. the MoE GPT (8 experts, top 2, 4 x 256) against the dense GPT of the
#     same active FFN, both bf16, at 1 x 2 (tokens/s; router untrained);
#  4. the default GPT (configs/gpt_single.yaml, 4 x 256, fortunes) for 500
#     steps in fp32 and in bf16: the final losses and their relative
#     difference, both curves on one chart (an SVG beside the results, and
#     in the terminal);
#  5. activation memory against the micro-batch size (1 and 8) at 12 x 768,
#     fp32 and bf16: the per-sequence slope apart from what does not scale.
#   bash bench/bench_precision.sh
# BENCH_PARTS ("1 2 3 4 5") runs only the parts named.
# Environment: HP_BIN (build/bin), BENCH_PYTHON (/usr/bin/python3),
# BENCH_STEPS (5 measured-run steps, the first 2 warm-up), BENCH_CURVE_STEPS
# (500), BENCH_PT_BF16_STEPS (BENCH_STEPS; on a CPU without AVX-512 one
# past the warm-up), BENCH_PT_BF16=0 (skip PyTorch's autocast runs), BENCH_CHART (the SVG's path; default bench/results/
# bench_precision_curves.svg), BENCH_QUICK=1 (smoke test: 4 x 256 for part
# 1, 3 steps, 40 curve steps, no chart file). The figures mean something
# only on an otherwise idle machine. On a CPU without avx512_bf16 hp's bf16
# products run on the fp32 BLAS (product_kernel: widen) and PyTorch's
# autocast runs ATen's slow bf16 loop: the start of the output says which.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${HP_BIN:-build/bin}
PY=${BENCH_PYTHON:-/usr/bin/python3}
QUICK=${BENCH_QUICK:-0}
STEPS=${BENCH_STEPS:-5}; WARMUP=2
CURVE_STEPS=${BENCH_CURVE_STEPS:-500}
CHART=${BENCH_CHART:-bench/results/bench_precision_curves.svg}
L=12; H=768; HEADS=12
if [[ $QUICK == 1 ]]; then L=4; H=256; HEADS=4; STEPS=3; CURVE_STEPS=40; CHART=""; fi
T=128; GB=16; MB=4
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
W=$(mktemp -d "${TMPDIR:-/tmp}/hp_bench_precision.XXXXXX")
trap 'rm -rf "$W"' EXIT
MP=(--set features.mixed_precision.enabled=true)
PARTS=" ${BENCH_PARTS:-1 2 3 4 5} "
part() { [[ $PARTS == *" $1 "* ]]; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /cpu: /'
echo "cpu flags: avx512f=$(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)" \
  "avx512_bf16=$(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no)"

cat > "$W/big.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: $HEADS, seq_len: $T}
data: {type: text, path: /usr/share/games/fortunes}
training: {max_steps: $STEPS, global_batch_size: $GB, micro_batch_size: $MB, log_interval: 1, eval_interval: 0}
optimizer: {type: adamw, lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML

# hp NAME NPROC ARGS...: one hp-train run of big.yaml (env from the caller).
hp() {
  local name=$1 n=$2; shift 2
  "$BIN/hp-train" "$W/big.yaml" --nproc "$n" "$@" --set run.output_dir="$W/$name" > "$W/$name.log" 2>&1 \
    || { tail -20 "$W/$name.log"; exit 1; }
}
# pt NAME NPROC ARGS...: the PyTorch twin on the same model and batch.
pt() {
  local name=$1 n=$2; shift 2
  local script=bench/pytorch_gpt_ddp.py
  local args=(--layers "$L" --hidden "$H" --heads "$HEADS" --seq "$T" --global-batch "$GB" --micro-batch "$MB"
              --steps "$STEPS" --out "$W/$name.jsonl" "$@")
  if ((n > 1)); then
    "$PY" -m torch.distributed.run --standalone --nproc_per_node "$n" --redirects 2 --tee 2 "$script" "${args[@]}" > "$W/$name.log" 2>&1
  else
    "$PY" "$script" "${args[@]}" > "$W/$name.log" 2>&1
  fi || { tail -20 "$W/$name.log"; exit 1; }
}

if part 1; then
echo "== 1. ${L} x ${H}, seq $T, global batch $GB (micro-batch $MB), $STEPS steps ($WARMUP warm-up)"
hp hp_fp32_1x2 1
grep -m1 -o "OpenBLAS kernels: .*" "$W/hp_fp32_1x2.log" || true
hp hp_bf16_1x2 1 "${MP[@]}"
grep -m1 -o "mixed precision: compute copies.*" "$W/hp_bf16_1x2.log" || true
OPENBLAS_CORETYPE=Haswell hp hp_fp32_haswell_1x2 1
pt pt_fp32_1x2 1
# PyTorch's autocast runs ATen's bf16 products, which without AVX-512 are a
# reference loop (tens of times slower than fp32): there it runs one step
# past the warm-up only (BENCH_PT_BF16_STEPS).
PT_BF16_STEPS=${BENCH_PT_BF16_STEPS:-$STEPS}
if ! grep -qw avx512f /proc/cpuinfo; then PT_BF16_STEPS=${BENCH_PT_BF16_STEPS:-$((WARMUP + 1))}; fi
# BENCH_PT_BF16=0 skips PyTorch's autocast runs (their figures print as 0).
PT_BF16=${BENCH_PT_BF16:-1}
if [[ $PT_BF16 == 1 ]]; then pt pt_bf16_1x2 1 --bf16 --steps "$PT_BF16_STEPS"; fi
hp hp_fp32_2x1 2
hp hp_bf16_2x1 2 "${MP[@]}"
hp hp_bf16r_2x1 2 "${MP[@]}" --set features.mixed_precision.reduce_dtype=bf16
pt pt_fp32_2x1 2
if [[ $PT_BF16 == 1 ]]; then pt pt_bf16_2x1 2 --bf16 --steps "$PT_BF16_STEPS"; fi
"$PY" - "$W" "$WARMUP" <<'PY'
import json, re, statistics, sys
w, warm = sys.argv[1], int(sys.argv[2])
def rows(name, pt):
    path = f"{w}/{name}.jsonl" if pt else f"{w}/{name}/metrics.jsonl"
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except FileNotFoundError:  # skipped (BENCH_PT_BF16=0)
        return [{"tokens_per_second": 0.0, "peak_resident_memory_bytes": 0, "resident_after_setup_bytes": 0}] * 8
def setup_rss(name, pt, recs):
    if pt:
        return recs[-1]["resident_after_setup_bytes"]
    m = re.search(r"after setup, resident memory ([0-9.]+) MiB", open(f"{w}/{name}.log").read())
    return float(m.group(1)) * 2**20
variants = [("hp fp32", "hp_fp32_1x2", 0), ("hp bf16", "hp_bf16_1x2", 0),
            ("hp fp32 Haswell kernels", "hp_fp32_haswell_1x2", 0),
            ("PyTorch fp32", "pt_fp32_1x2", 1), ("PyTorch autocast bf16", "pt_bf16_1x2", 1),
            ("hp fp32 dp=2", "hp_fp32_2x1", 0), ("hp bf16 dp=2", "hp_bf16_2x1", 0),
            ("hp bf16 dp=2, bf16 sums", "hp_bf16r_2x1", 0),
            ("PyTorch DDP fp32 dp=2", "pt_fp32_2x1", 1), ("PyTorch DDP autocast bf16 dp=2", "pt_bf16_2x1", 1)]
res = {}
print(f"{'variant':34} {'tokens/s':>9} {'act. MiB':>9}  bytes per step per group (rank 0)")
for label, name, pt in variants:
    recs = rows(name, pt)
    tps = statistics.median(r["tokens_per_second"] for r in recs[warm:])
    act = (recs[-1]["peak_resident_memory_bytes"] - setup_rss(name, pt, recs)) / 2**20
    comm = "" if pt else ", ".join(f"{k[11:]} {v/2**20:.1f} MiB" for k, v in sorted(recs[-1].items())
                                   if k.startswith("comm_bytes_") and v > 0)
    res[name] = (tps, act)
    print(f"{label:34} {tps:9.1f} {act:9.1f}  {comm}")
r = lambda a, b: res[a][0] / res[b][0] if res[b][0] else float("nan")
m = lambda a, b: res[a][1] / res[b][1]
print(f"bf16 / fp32 tokens/s: 1 x 2 {r('hp_bf16_1x2','hp_fp32_1x2'):.2f} (against the Haswell-kernel fp32: "
      f"{r('hp_bf16_1x2','hp_fp32_haswell_1x2'):.2f}); dp=2 {r('hp_bf16_2x1','hp_fp32_2x1'):.2f}, "
      f"with bf16 sums {r('hp_bf16r_2x1','hp_fp32_2x1'):.2f}")
print(f"hp bf16 / PyTorch autocast bf16 tokens/s: 1 x 2 {r('hp_bf16_1x2','pt_bf16_1x2'):.2f}; "
      f"dp=2 {r('hp_bf16_2x1','pt_bf16_2x1'):.2f}")
print(f"activation memory bf16 / fp32: 1 x 2 {m('hp_bf16_1x2','hp_fp32_1x2'):.2f}; "
      f"dp=2 {m('hp_bf16_2x1','hp_fp32_2x1'):.2f}")
PY

fi

cat > "$W/small.yaml" <<YAML
model: {type: gpt, layers: 4, hidden: 256, heads: 4, seq_len: $T}
data: {type: text, path: /usr/share/games/fortunes}
training: {max_steps: 2, global_batch_size: 8, micro_batch_size: 2, log_interval: 1, eval_interval: 0}
checkpoint: {interval: 0, resume: never}
metrics: {peak_flops: 1.0e+10}
YAML
if part 2; then
echo "== 2. bytes per step per group, fp32 against bf16 (4 x 256, 2 steps)"
layouts=(
  "tp2|--set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 --set features.tensor_parallel.sequence_parallel=true"
  "pp2|--set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2"
  "ep2|--set model.moe.num_experts=4 --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2"
  "cp2|--set features.context_parallel.enabled=true --set features.context_parallel.size=2"
  "z3|--set features.zero.enabled=true --set features.zero.stage=3")
for l in "${layouts[@]}"; do
  name=${l%%|*}; args=${l#*|}
  for p in fp32 bf16; do
    extra=(); [[ $p == bf16 ]] && extra=("${MP[@]}")
    # shellcheck disable=SC2086
    "$BIN/hp-train" "$W/small.yaml" --nproc 2 $args "${extra[@]}" --set run.output_dir="$W/b_${name}_$p" \
      > "$W/b_${name}_$p.log" 2>&1 || { tail -20 "$W/b_${name}_$p.log"; exit 1; }
  done
done
"$PY" - "$W" "${layouts[@]%%|*}" <<'PY'
import json, sys
w = sys.argv[1]
for name in sys.argv[2:]:
    last = lambda p: [json.loads(l) for l in open(f"{w}/b_{name}_{p}/metrics.jsonl") if l.strip()][-1]
    a, b = last("fp32"), last("bf16")
    for k in sorted(a):
        if k.startswith("comm_bytes_") and a[k] > 0:
            print(f"  {name:4} {k[11:]:34} fp32 {a[k]:12.0f}  bf16 {b.get(k, 0):12.0f}  ratio {b.get(k, 0) / a[k]:.3f}")
PY

fi

if part 3; then
echo "== 3. MoE (8 experts, top 2) against the dense GPT of the same active FFN, bf16, 1 x 2 (4 x 256)"
for v in "moe|--set model.moe.num_experts=8 --set model.moe.top_k=2 --set model.moe.ffn_hidden=512" \
         "dense|--set model.ffn_hidden=1024"; do
  name=${v%%|*}; args=${v#*|}
  # shellcheck disable=SC2086
  "$BIN/hp-train" "$W/small.yaml" --nproc 1 $args "${MP[@]}" --set training.max_steps=8 \
    --set run.output_dir="$W/m_$name" > "$W/m_$name.log" 2>&1 || { tail -20 "$W/m_$name.log"; exit 1; }
done
"$PY" - "$W" <<'PY'
import json, statistics, sys
w = sys.argv[1]
tps = {n: statistics.median(json.loads(l)["tokens_per_second"] for l in list(open(f"{w}/m_{n}/metrics.jsonl"))[2:])
       for n in ("moe", "dense")}
print(f"  MoE {tps['moe']:.0f} tokens/s, dense {tps['dense']:.0f} tokens/s: MoE / dense {tps['moe'] / tps['dense']:.2f}")
PY

fi

if part 4; then
echo "== 4. configs/gpt_single.yaml for $CURVE_STEPS steps, fp32 and bf16"
for p in fp32 bf16; do
  extra=(); [[ $p == bf16 ]] && extra=("${MP[@]}")
  "$BIN/hp-train" configs/gpt_single.yaml --set training.max_steps="$CURVE_STEPS" --set training.log_interval=1 \
    --set training.eval_interval="$CURVE_STEPS" --set checkpoint.interval=0 --set metrics.peak_flops=1e11 \
    "${extra[@]}" --set run.output_dir="$W/c_$p" > "$W/c_$p.log" 2>&1 || { tail -20 "$W/c_$p.log"; exit 1; }
done
"$PY" - "$W" "$CHART" <<'PY'
import json, sys
w, chart = sys.argv[1], sys.argv[2]
def curve(p):
    recs = [json.loads(l) for l in open(f"{w}/c_{p}/metrics.jsonl") if l.strip()]
    loss = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    ev = [r["eval_loss"] for r in recs if "eval_loss" in r]
    return loss, ev[-1] if ev else float("nan")
(a, ea), (b, eb) = curve("fp32"), curve("bf16")
tail = lambda c: sum(v for _, v in c[-20:]) / len(c[-20:])
ta, tb = tail(a), tail(b)
print(f"  final loss (mean of the last 20 steps): fp32 {ta:.4f}, bf16 {tb:.4f}, relative {abs(tb - ta) / ta:.2%}")
print(f"  final eval loss: fp32 {ea:.4f}, bf16 {eb:.4f}, relative {abs(eb - ea) / ea:.2%}")
# The chart in the terminal: 60 columns (steps), 16 rows (loss); f fp32,
# b bf16, * both.
cols, rows = 60, 16
lo = min(v for _, v in a + b); hi = max(v for _, v in a[len(a) // 20:] + b[len(b) // 20:])
grid = [[" "] * cols for _ in range(rows)]
n = len(a)
for series, ch in ((a, "f"), (b, "b")):
    for c in range(cols):
        chunk = series[c * n // cols:(c + 1) * n // cols] or series[-1:]
        v = sum(x for _, x in chunk) / len(chunk)
        r = rows - 1 - min(rows - 1, max(0, int((v - lo) / (hi - lo + 1e-12) * (rows - 1))))
        grid[r][c] = "*" if grid[r][c] not in (" ", ch) else ch
for i, line in enumerate(grid):
    y = hi - (hi - lo) * i / (rows - 1)
    print(f"  {y:6.3f} |" + "".join(line))
print("         +" + "-" * cols + f"  steps 1..{n}  (f fp32, b bf16, * both)")
if chart:
    W_, H_ = 640, 360
    def path(series):
        pts = []
        for s, v in series:
            x = 50 + (s - 1) / max(1, n - 1) * (W_ - 70)
            y = 20 + (hi - min(max(v, lo), hi)) / (hi - lo + 1e-12) * (H_ - 60)
            pts.append(f"{x:.1f},{y:.1f}")
        return " ".join(pts)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W_}" height="{H_}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W_}" height="{H_}" fill="white"/>',
           f'<text x="50" y="14">training loss, {n} steps: fp32 (blue) and bf16 mixed precision (orange)</text>',
           f'<line x1="50" y1="{H_-40}" x2="{W_-20}" y2="{H_-40}" stroke="black"/>',
           f'<line x1="50" y1="20" x2="50" y2="{H_-40}" stroke="black"/>',
           f'<text x="4" y="24">{hi:.2f}</text><text x="4" y="{H_-40}">{lo:.2f}</text>',
           f'<text x="{W_-80}" y="{H_-24}">step {n}</text>',
           f'<polyline fill="none" stroke="#1f77b4" stroke-width="1" points="{path(a)}"/>',
           f'<polyline fill="none" stroke="#ff7f0e" stroke-width="1" points="{path(b)}"/>', '</svg>']
    open(chart, "w").write("\n".join(svg) + "\n")
    print(f"  chart: {chart}")
PY
fi

if part 5; then
# Activation memory against the micro-batch size (1 and 8 sequences, one
# micro-batch a step, 2 steps): rank 0's peak minus its resident memory
# after setup. The slope between the two sizes is what each token's
# activations cost; the part at micro-batch 1 holds what does not scale
# with the batch (transients of the first backward and the update).
echo "== 5. activation memory (MiB) at micro-batch 1 and 8, ${L} x ${H}, 1 x 2"
for mb in 1 8; do
  for p in fp32 bf16; do
    extra=(); [[ $p == bf16 ]] && extra=("${MP[@]}")
    "$BIN/hp-train" "$W/big.yaml" --nproc 1 --set training.max_steps=2 --set training.global_batch_size=$mb \
      --set training.micro_batch_size=$mb --set metrics.peak_flops=1e11 "${extra[@]}" \
      --set run.output_dir="$W/a_${p}_$mb" > "$W/a_${p}_$mb.log" 2>&1 || { tail -20 "$W/a_${p}_$mb.log"; exit 1; }
  done
done
"$PY" - "$W" <<'PY'
import json, re, sys
w = sys.argv[1]
def act(p, mb):
    setup = float(re.search(r"after setup, resident memory ([0-9.]+) MiB", open(f"{w}/a_{p}_{mb}.log").read()).group(1))
    last = [json.loads(l) for l in open(f"{w}/a_{p}_{mb}/metrics.jsonl") if l.strip()][-1]
    return last["peak_resident_memory_bytes"] / 2**20 - setup
a = {(p, mb): act(p, mb) for p in ("fp32", "bf16") for mb in (1, 8)}
for p in ("fp32", "bf16"):
    print(f"  {p}: micro-batch 1 {a[(p, 1)]:.0f}, micro-batch 8 {a[(p, 8)]:.0f}, per sequence "
          f"{(a[(p, 8)] - a[(p, 1)]) / 7:.1f}")
print(f"  bf16 / fp32: at micro-batch 8 {a[('bf16', 8)] / a[('fp32', 8)]:.2f}; per sequence (the slope) "
      f"{(a[('bf16', 8)] - a[('bf16', 1)]) / (a[('fp32', 8)] - a[('fp32', 1)]):.2f}")
PY
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
