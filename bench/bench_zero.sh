#!/usr/bin/env bash
# zero side by side in one run (figures printed, never asserted): per rank
# at dp = 1, 2, 4 for zero off and stages 1, 2 and 3, the model state a
# rank holds between steps (parameters, gradients, optimizer state; from
# metrics.jsonl) beside the accounting formula, the peak resident memory
# (VmHWM) of training (rank 0, before the run's final save: the last step's
# peak_resident_memory_bytes) and of the whole run (every rank, the final
# save included: a save gathers whole tensors) and the step time; then zero at dp=2 with distributed.overlap on
# against off, and stage 3 at dp=2 with the gradients reduced once a step (reduce_per_micro_batch: false),
# with recompute and without the block cache, at dp=4 with recompute.
#   bash bench/bench_zero.sh [hidden=256] [steps=12] [layers=4]
# Each rank gets cores / ranks intra-op threads (hp-launch), so dp=4 on this
# 2-core machine runs 4 single-thread processes on 2 cores: its step times
# say little; its bytes are exact.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
H=${1:-256}; STEPS=${2:-12}; L=${3:-4}
DPS=${BENCH_DPS:-1 2 4}  # e.g. BENCH_DPS="1 2" for the large model
# BENCH_QUICK=1: only zero off and stages 1-3 per dp (the memory table and
# step times), none of the variants below.
QUICK=${BENCH_QUICK:-0}
# BENCH_SET: extra key=value settings for every run, space-separated (e.g.
# "run.keep_freed_memory=false" to measure with freed memory returned).
EXTRA=()
for kv in ${BENCH_SET:-}; do EXTRA+=(--set "$kv"); done
T=128; B=8; M=2
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: 4, seq_len: $T}
data: {type: text}
training: {max_steps: $STEPS, global_batch_size: $B, micro_batch_size: $M, log_interval: 1, eval_interval: 0}
optimizer: {type: adamw, lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
for dp in $DPS; do
  for z in off 1 2 3; do
    name="dp${dp}_$z"
    if [[ $z == off ]]; then zargs=(--set features.zero.enabled=false)
    else zargs=(--set features.zero.enabled=true --set features.zero.stage=$z); fi
    "$BIN/hp-train" "$W/c.yaml" --nproc "$dp" "${zargs[@]}" ${EXTRA[@]+"${EXTRA[@]}"} --set run.output_dir="$W/$name" \
      > "$W/$name.log" 2>&1 || { cat "$W/$name.log"; exit 1; }
  done
done
# zero at dp=2 with the blocking path (distributed.overlap: false): the
# reduce-scatters after backward, the all-gathers inside the update.
if [[ $QUICK != 1 ]]; then
"$BIN/hp-train" "$W/c.yaml" --nproc 2 --set features.zero.enabled=true --set distributed.overlap=false ${EXTRA[@]+"${EXTRA[@]}"} \
  --set run.output_dir="$W/dp2_1_blocking" > "$W/dp2_1_blocking.log" 2>&1 || { cat "$W/dp2_1_blocking.log"; exit 1; }
"$BIN/hp-train" "$W/c.yaml" --nproc 2 --set features.zero.enabled=true --set distributed.overlap=true ${EXTRA[@]+"${EXTRA[@]}"} \
  --set run.output_dir="$W/dp2_1_overlap" > "$W/dp2_1_overlap.log" 2>&1 || { cat "$W/dp2_1_overlap.log"; exit 1; }
# Stage 3 at dp=2 with the gradients reduced once a step
# (features.zero.reduce_per_micro_batch: false: the full gradients held
# across the micro-batches, stage 1's numbers bitwise; the default reduces
# per micro-batch), with activation recompute, and with the block cache off
# (glibc's heap, as before it); at dp=4 (one micro-batch a rank) stage 3
# with recompute.
VARIANTS="2:once 2:rc 2:nocache"
[[ " $DPS " == *" 4 "* ]] && VARIANTS="$VARIANTS 4:rc"
else
VARIANTS=""
fi
for dv in $VARIANTS; do
  dp=${dv%%:*}; v=${dv#*:}
  case $v in
    once) vargs=(--set features.zero.reduce_per_micro_batch=false) ;;
    rc) vargs=(--set features.recompute.enabled=true) ;;
    nocache) vargs=(--set features.zero.block_cache=false) ;;
  esac
  "$BIN/hp-train" "$W/c.yaml" --nproc "$dp" --set features.zero.enabled=true --set features.zero.stage=3 "${vargs[@]}" \
    ${EXTRA[@]+"${EXTRA[@]}"} --set run.output_dir="$W/dp${dp}_3_$v" > "$W/dp${dp}_3_$v.log" 2>&1 \
    || { cat "$W/dp${dp}_3_$v.log"; exit 1; }
done
# Stage 3 at dp=2 with the trace on (4 steps): how much of the parameter
# gathers' time the blocks' compute hides (bench/trace_overlap.py --gathers).
if [[ " $DPS " == *" 2 "* && $QUICK != 1 ]]; then
  "$BIN/hp-train" "$W/c.yaml" --nproc 2 --set features.zero.enabled=true --set features.zero.stage=3 \
    --set run.profile.enabled=true --set training.max_steps=4 ${EXTRA[@]+"${EXTRA[@]}"} \
    --set run.output_dir="$W/dp2_3_trace" > "$W/dp2_3_trace.log" 2>&1 || { cat "$W/dp2_3_trace.log"; exit 1; }
fi
python3 - "$W" "$H" "$L" "$T" "$B" "$DPS" "$QUICK" <<'PY'
import json, re, statistics, sys
w, H, L, T, B = sys.argv[1], *map(int, sys.argv[2:6])
DPS = [int(x) for x in sys.argv[6].split()]
QUICK = sys.argv[7] == "1"
MiB = 1024 * 1024
def peaks(name):
    out = {}
    for line in open(f"{w}/{name}.log"):
        m = re.search(r"\[rank (\d+)[^\]]*\].*this rank: optimizer state (\d+) bytes, peak resident memory ([\d.]+) MiB", line)
        if m:
            out[int(m.group(1))] = float(m.group(3))
    return [out[k] for k in sorted(out)]
def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()]
def step_seconds(name):
    return statistics.median(r["step_seconds"] for r in rows(name)[1:])  # step 1 warms up
def state(name, dp, z):
    last = rows(name)[-1]
    opt = last["optimizer_state_bytes"]
    if z == "off":
        return psi * 4, psi * 4, opt
    return last["zero_param_bytes"], last["zero_full_grad_bytes"] + last["zero_slice_grad_bytes"], opt
first = rows(f"dp{DPS[0]}_off")[-1]
psi = first["optimizer_state_bytes"] / 8  # AdamW: two fp32 tensors per parameter
print(f"GPT {L} layers x {H} wide, seq {T}, global batch {B}, AdamW, fp32: Ψ = {psi / 1e6:.2f} M parameters "
      f"({16 * psi / MiB:.0f} MiB of model state: 4Ψ parameters + 4Ψ gradients + 8Ψ AdamW state)")
formula = {"off": lambda n: 16 * psi, "1": lambda n: 8 * psi + 8 * psi / n if n > 1 else 16 * psi,
           "2": lambda n: 4 * psi + 12 * psi / n if n > 1 else 16 * psi, "3": lambda n: 16 * psi / n}
print("model state per rank between steps (rank 0), MiB; formula: off 16Ψ, stage 1 8Ψ + 8Ψ/N (the reduced "
      "slices live inside the full gradients), stage 2 4Ψ + 12Ψ/N, stage 3 16Ψ/N")
print(f"{'dp':>3s} {'zero':>5s} {'params':>8s} {'grads':>8s} {'state':>8s} {'total':>8s} {'formula':>8s} "
      f"{'training peak':>14s} {'run peak (with save) per rank':>30s} {'step s':>8s}")
def train_peak(name):
    return max(r.get("peak_resident_memory_bytes", 0) for r in rows(name)) / MiB
for dp in DPS:
    for z in ("off", "1", "2", "3"):
        name = f"dp{dp}_{z}"
        p, g, s = state(name, dp, z)
        print(f"{dp:3d} {z:>5s} {p / MiB:8.1f} {g / MiB:8.1f} {s / MiB:8.1f} {(p + g + s) / MiB:8.1f} "
              f"{formula[z](dp) / MiB:8.1f} {train_peak(name):14.0f} {' '.join('%.0f' % x for x in peaks(name)):>30s} "
              f"{step_seconds(name):8.3f}")
for dp in [d for d in DPS if d > 1]:
    base, base_peak = step_seconds(f"dp{dp}_off"), train_peak(f"dp{dp}_off")
    print(f"dp={dp}: " + ", ".join(
        f"stage {z} {step_seconds(f'dp{dp}_{z}') / base:.2f}x the step time, {train_peak(f'dp{dp}_{z}') / base_peak:.2f}x the training peak"
        for z in ("1", "2", "3")) + " of plain dp")
r3 = rows("dp2_3")[1:]
if r3 and "zero_block_gathers" in r3[-1]:
    print(f"dp=2 stage 3: {statistics.median(r['zero_block_gathers'] for r in r3):.0f} block gathers per step, "
          f"{statistics.median(r['zero_block_gathers_prefetched'] for r in r3):.0f} of them prefetched; at most "
          f"{max(r['zero_gathered_peak_bytes'] for r in r3) / MiB:.1f} of {r3[-1]['zero_sharded_param_bytes'] / MiB:.1f} "
          f"MiB of parameters whole at once")
what = {"once": "reduce_per_micro_batch: false (reduced once a step, stage 1's sums)",
        "nocache": "block_cache: false", "rc": "recompute"}
for dp, v in [(2, "once"), (2, "rc"), (2, "nocache"), (4, "rc")]:
    if dp not in DPS or QUICK:
        continue
    base, base_peak = step_seconds(f"dp{dp}_off"), train_peak(f"dp{dp}_off")
    print(f"dp={dp} stage 3 with {what[v]}: training peak {train_peak(f'dp{dp}_3_{v}'):.0f} MiB "
          f"({train_peak(f'dp{dp}_3_{v}') / base_peak:.2f}x plain), step {step_seconds(f'dp{dp}_3_{v}'):.3f} s "
          f"({step_seconds(f'dp{dp}_3_{v}') / base:.2f}x plain)")
if QUICK:
    sys.exit(0)
on, off = step_seconds("dp2_1_overlap"), step_seconds("dp2_1_blocking")
wait = statistics.mean(r.get("zero_gather_wait_seconds", 0) for r in rows("dp2_1_overlap")[1:])
print(f"dp=2 stage 1: overlap on {on:.3f} s vs off {off:.3f} s ({100 * (on / off - 1):+.1f}%); with it on, the "
      f"forward still waited {1000 * wait:.2f} ms per step for {rows('dp2_1_overlap')[-1].get('zero_gathers', 0):.0f} "
      f"parameter gathers")
PY
if [[ " $DPS " == *" 2 "* && $QUICK != 1 ]]; then
  python3 bench/trace_overlap.py --gathers "$W/dp2_3_trace" | sed "s|$W/dp2_3_trace|dp=2 stage 3, 4 traced steps|"
fi
