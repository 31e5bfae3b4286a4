#!/usr/bin/env bash
# Mixture of experts side by side in one run (figures printed, never
# asserted): an 8-expert top-2 GPT (4 x 256) at ep=2 (2 processes x 1
# thread) beside one process x 2 threads and beside a dense GPT of the same
# active parameters (FFN width 2 x the expert width); all-to-all bytes per
# step beside the theory; expert-parameter bytes per rank; load imbalance
# over the run with the aux loss, with the bias method, and with neither.
#   bash bench/bench_moe.sh [steps=80] [speed]
# BENCH_MODEL=llama: the same with model.type: llama (SwiGLU experts of
# width 768 through the library's products, dense SwiGLU of 1536).
# `speed` runs only the throughput runs (MoE and dense at 1 process x 2
# threads, MoE at ep=2 and dense at dp=2, 2 processes x 1 thread, MoE with a
# capacity factor, MoE with its experts through BLAS; then the same pairs with one micro-batch per step
# instead of micro-batch 2; the MoE trained with the device-level
# balance loss over the ep ranks' expert groups, at ep=2; and on a CPU with
# AVX-512F, both models at 1 x 2 and at ep=2 / dp=2 with OpenBLAS's AVX-512
# kernels, OPENBLAS_CORETYPE=SKYLAKEX), BENCH_REPS
# times interleaved, and prints each MoE run
# over the dense run of the same layout, with the load imbalance; then
# how evenly the two ep ranks' experts are loaded, with and without the
# device-level loss (one profiled run each). Those
# runs measure a trained router, not one at initialisation: the MoE and
# the dense GPT are each trained BENCH_WARM_STEPS (120) steps once (1
# process x 2 threads, the learning rate warmed up over the first
# quarter), and every measured run resumes its model's checkpoint (at its
# own layout: the checkpoints re-shard) for BENCH_MEASURE_STEPS (30) more,
# timed from the third. From initialisation the router needs about 100
# steps for the load imbalance to fall from 3-4 to about 1.6 (byte-level
# text: a few bytes are most of the tokens), and an 80-step run measures
# mostly that descent.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
STEPS=${1:-80}
ONLY=${2:-all}
WARM_STEPS=${BENCH_WARM_STEPS:-120}
MEASURE_STEPS=${BENCH_MEASURE_STEPS:-30}
if [ "$ONLY" = speed ]; then STEPS=$WARM_STEPS; fi
H=256; L=4; T=128; B=8; M=2; E=8; K=2
# The learning rate rises over the first quarter of the run (linear
# warm-up, as MoE recipes do): at 0.002 from the first step Adam's first
# updates move every token's router logits the same way and the router
# collapses onto one expert (load imbalance 4.0, the most for 8 experts
# and top-2, from step 2 on), which the aux loss takes most of the run
# to undo. Every run here, dense ones included, has the same schedule.
WARMUP=$((STEPS / 4))
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
MODEL=${BENCH_MODEL:-gpt}
FFN=$((4 * H)); [ "$MODEL" = llama ] && FFN=768
if [ "$MODEL" = llama ] && [ "$ONLY" != speed ]; then
  echo "bench_moe: BENCH_MODEL=llama runs the speed part only (the byte and balance tables count GELU experts): bash bench/bench_moe.sh 80 speed"
  exit 2
fi
cat > "$W/c.yaml" <<YAML
model: {type: $MODEL, layers: $L, hidden: $H, heads: 4, seq_len: $T, ffn_hidden: $FFN}
data: {type: text}
training: {max_steps: $STEPS, global_batch_size: $B, micro_batch_size: $M, log_interval: 1}
optimizer: {lr: 0.002, schedule: constant, warmup_steps: $WARMUP}
checkpoint: {interval: 0, resume: never}
YAML
moe=(--set model.moe.num_experts=$E --set model.moe.top_k=$K)
ep=(--set features.expert_parallel.enabled=true --set features.expert_parallel.size=2)
run() {  # NAME ENV ARGS...
  local name=$1 envs=$2; shift 2
  env $envs "$BIN/hp-train" "$W/c.yaml" --set run.output_dir="$W/$name" "$@" > "$W/$name.log" 2>&1 \
    || { cat "$W/$name.log"; exit 1; }
}
# The throughput runs; `speed` repeats them BENCH_REPS times (default 5),
# interleaved, since single runs on this machine scatter by 10-20 %.
cap=(--set model.moe.capacity_factor=1.25)
dev=(--set model.moe.device_balance_coef=0.05 --set model.moe.device_groups=2)
dense=(--set model.ffn_hidden=$((2 * FFN)))
from_moe=() from_dense=() from_dev=()
throughput() {  # SUFFIX
  run moe_1p2t$1 "HP_INTRA_OP_THREADS=2" "${moe[@]}" "${from_moe[@]}"
  run dense_1p2t$1 "HP_INTRA_OP_THREADS=2" "${dense[@]}" "${from_dense[@]}"
  run moe_ep2$1 "" --nproc 2 "${moe[@]}" "${ep[@]}" "${from_moe[@]}"
  run dense_dp2$1 "" --nproc 2 "${dense[@]}" "${from_dense[@]}"
  # The MoE trained with the device-level balance loss over the two ep
  # ranks' expert groups as well (its own warm-up run), at ep=2.
  if [ "$ONLY" = speed ]; then
    run moe_ep2_dev$1 "" --nproc 2 "${moe[@]}" "${dev[@]}" "${ep[@]}" "${from_dev[@]}"
  fi
  # The same MoE with a capacity of 1.25 x the balanced share per expert
  # (tokens over it dropped, as Switch, GShard and DeepSpeed's MoE do): the
  # busiest expert, and so the busiest ep rank, does at most 1.25 x its share.
  run moe_1p2t_cap$1 "HP_INTRA_OP_THREADS=2" "${moe[@]}" "${cap[@]}" "${from_moe[@]}"
  run moe_ep2_cap$1 "" --nproc 2 "${moe[@]}" "${ep[@]}" "${cap[@]}" "${from_moe[@]}"
  # One micro-batch per step (a rank's whole share of the batch), MoE and
  # dense alike: four times the rows per expert product of micro-batch 2
  # (about 256 at one process, 2 x 128 at ep=2, against 64), so each expert
  # weight read from memory serves four times the arithmetic.
  if [ "$ONLY" = speed ]; then
    # The experts through BLAS (model.moe.expert_compute: slices) instead of
    # the packed-weight product (the default).
    run moe_1p2t_slices$1 "HP_INTRA_OP_THREADS=2" "${moe[@]}" --set model.moe.expert_compute=slices "${from_moe[@]}"
    run moe_1p2t_mb$1 "HP_INTRA_OP_THREADS=2" "${moe[@]}" "${whole_mb[@]}" "${from_moe[@]}"
    run dense_1p2t_mb$1 "HP_INTRA_OP_THREADS=2" "${dense[@]}" "${whole_mb[@]}" "${from_dense[@]}"
    run moe_ep2_mb$1 "" --nproc 2 "${moe[@]}" "${ep[@]}" "${half_mb[@]}" "${from_moe[@]}"
    run dense_dp2_mb$1 "" --nproc 2 "${dense[@]}" "${half_mb[@]}" "${from_dense[@]}"
    # Both models again with OpenBLAS's AVX-512 kernels (OPENBLAS_CORETYPE=
    # SKYLAKEX) where the CPU has AVX-512F: Debian's OpenBLAS 0.3.21 runs
    # its Haswell (AVX2) kernels on this machine's CPU, which it does not
    # know, and the dense GPT is mostly BLAS. The experts' packed product
    # runs AVX-512 either way.
    if [ "$AVX512" = yes ]; then
      run moe_1p2t_obx$1 "HP_INTRA_OP_THREADS=2 OPENBLAS_CORETYPE=SKYLAKEX" "${moe[@]}" "${from_moe[@]}"
      run dense_1p2t_obx$1 "HP_INTRA_OP_THREADS=2 OPENBLAS_CORETYPE=SKYLAKEX" "${dense[@]}" "${from_dense[@]}"
      run moe_ep2_obx$1 "OPENBLAS_CORETYPE=SKYLAKEX" --nproc 2 "${moe[@]}" "${ep[@]}" "${from_moe[@]}"
      run dense_dp2_obx$1 "OPENBLAS_CORETYPE=SKYLAKEX" --nproc 2 "${dense[@]}" "${from_dense[@]}"
    fi
  fi
}
AVX512=no; grep -qw avx512f /proc/cpuinfo && AVX512=yes
whole_mb=(--set training.micro_batch_size=$B)
half_mb=(--set training.micro_batch_size=$((B / 2)))
if [ "$ONLY" != speed ]; then
  throughput ""
else
  # Train each model once, then measure from its checkpoint.
  run warm_moe "HP_INTRA_OP_THREADS=2" "${moe[@]}"
  run warm_dense "HP_INTRA_OP_THREADS=2" "${dense[@]}"
  run warm_dev "HP_INTRA_OP_THREADS=2" "${moe[@]}" "${dev[@]}"
  last=$(printf 'step_%08d' "$WARM_STEPS")
  more=(--set training.max_steps=$((WARM_STEPS + MEASURE_STEPS)))
  from_moe=("${more[@]}" --set checkpoint.resume="$W/warm_moe/checkpoints/$last")
  from_dense=("${more[@]}" --set checkpoint.resume="$W/warm_dense/checkpoints/$last")
  from_dev=("${more[@]}" --set checkpoint.resume="$W/warm_dev/checkpoints/$last")
  for r in $(seq "${BENCH_REPS:-5}"); do throughput "_r$r"; done
  # Each ep rank's expert rows per MoE layer and micro-batch, from a profile
  # (run.profile) of the last 20 steps of one more ep=2 run of each MoE:
  # every exchange waits for the busiest rank (bench/moe_rank_load.py).
  prof=(--set run.profile.enabled=true
        --set "run.profile.steps=[$(seq -s, $((WARM_STEPS + MEASURE_STEPS - 19)) $((WARM_STEPS + MEASURE_STEPS)))]")
  run load_ep2 "" --nproc 2 "${moe[@]}" "${ep[@]}" "${from_moe[@]}" "${prof[@]}"
  run load_ep2_dev "" --nproc 2 "${moe[@]}" "${dev[@]}" "${ep[@]}" "${from_dev[@]}" "${prof[@]}"
fi
if [ "$ONLY" = speed ]; then
  BENCH_MODEL=$MODEL python3 - "$W" "$WARM_STEPS" "${BENCH_REPS:-5}" "$AVX512" <<'PY'
import json, os, statistics, sys
w, warm, reps, avx512 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "yes"
def rows(name):  # the resumed run's steps from its third on
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()][2:]
def median_step(name, key):  # the median step's figure: a stall of the machine moves it little
    return statistics.median(x.get(key, 0) for x in rows(name))
def fast(name):  # a fast step's tokens/s (the 90th percentile): this machine's noise only slows steps
    v = sorted(x["tokens_per_second"] for x in rows(name))
    return v[min(len(v) - 1, int(0.9 * len(v)))]
first = rows("moe_1p2t_r1")[0]["step"]
print(f"each model trained {warm} steps, then resumed: steps {first}-{rows('moe_1p2t_r1')[-1]['step']}: median step's tokens/s "
      f"per run, median of {reps} interleaved repetitions; x dense: the median of each repetition's ratio (and "
      f"their range)")
print("fast steps: the same with each run's 90th-percentile step (tokens/s) in place of its median step")
def warm_loss(name):  # the mean loss of the warm-up run's last 10 steps
    r = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()][-10:]
    return sum(x["loss"] for x in r) / len(r)
print(f"warm-up losses (last 10 of {warm} steps): MoE {warm_loss('warm_moe'):.4f}, MoE with the device-level "
      f"balance loss {warm_loss('warm_dev'):.4f}, dense {warm_loss('warm_dense'):.4f}")
print(f"{'run':44s} {'tokens/s':>9s} {'x dense':>8s} {'range':>11s} {'fast steps':>11s} {'range':>11s} {'imbalance':>10s} {'dropped':>8s}")
for name, label, dense in ([("moe_1p2t", "MoE, 1 process x 2 threads", "dense_1p2t"),
                           ("moe_1p2t_cap", "MoE, 1 x 2, capacity factor 1.25", "dense_1p2t"),
                           ("moe_1p2t_slices", "MoE, 1 x 2, experts through BLAS (slices)", "dense_1p2t"),
                           ("dense_1p2t", "dense GPT of the same active FFN, 1 x 2", "dense_1p2t"),
                           ("moe_ep2", "MoE, ep=2 (2 processes x 1 thread)", "dense_dp2"),
                           ("moe_ep2_cap", "MoE, ep=2, capacity factor 1.25", "dense_dp2"),
                           ("moe_ep2_dev", "MoE, ep=2, device-level balance loss 0.05", "dense_dp2"),
                           ("dense_dp2", "dense GPT, dp=2 (2 processes x 1 thread)", "dense_dp2"),
                           ("moe_1p2t_mb", "MoE, 1 x 2, one micro-batch of 8", "dense_1p2t_mb"),
                           ("dense_1p2t_mb", "dense GPT, 1 x 2, one micro-batch of 8", "dense_1p2t_mb"),
                           ("moe_ep2_mb", "MoE, ep=2, one micro-batch of 4 per rank", "dense_dp2_mb"),
                           ("dense_dp2_mb", "dense GPT, dp=2, one micro-batch of 4 per rank", "dense_dp2_mb")]
           + ([("moe_1p2t_obx", "MoE, 1 x 2, OpenBLAS AVX-512 kernels", "dense_1p2t_obx"),
               ("dense_1p2t_obx", "dense GPT, 1 x 2, OpenBLAS AVX-512 kernels", "dense_1p2t_obx"),
               ("moe_ep2_obx", "MoE, ep=2, OpenBLAS AVX-512 kernels", "dense_dp2_obx"),
               ("dense_dp2_obx", "dense GPT, dp=2, OpenBLAS AVX-512 kernels", "dense_dp2_obx")] if avx512 else [])):
    runs = [f"{name}_r{r}" for r in range(1, reps + 1)]
    tps = [median_step(n, "tokens_per_second") for n in runs]
    ratio = [median_step(n, "tokens_per_second") / median_step(f"{dense}_r{r}", "tokens_per_second") for r, n in enumerate(runs, 1)]
    fratio = [fast(n) / fast(f"{dense}_r{r}") for r, n in enumerate(runs, 1)]
    imb = statistics.median(median_step(n, "moe_load_imbalance_max") for n in runs)
    drop = statistics.median(median_step(n, "moe_dropped_fraction_max") for n in runs)
    label = label.replace("GPT", os.environ.get("BENCH_MODEL", "gpt"))
    print(f"{label:44s} {statistics.median(tps):9.0f} {statistics.median(ratio):8.2f} "
          f"{min(ratio):5.2f}-{max(ratio):<5.2f} {statistics.median(fratio):11.2f} "
          f"{min(fratio):5.2f}-{max(fratio):<5.2f} {imb:10.3f} {drop:8.3f}")
PY
  echo "expert rows per ep rank (profiled steps $((WARM_STEPS + MEASURE_STEPS - 19))-$((WARM_STEPS + MEASURE_STEPS))): MoE, then with the device-level balance loss"
  python3 bench/moe_rank_load.py "$W/load_ep2" 2 | sed "s|$W/||"
  python3 bench/moe_rank_load.py "$W/load_ep2_dev" 2 | sed "s|$W/||"
  exit 0
fi
run moe_dp2 "" --nproc 2 "${moe[@]}"
run bal_aux "" --nproc 2 "${moe[@]}" "${ep[@]}" --set model.moe.aux_loss_coef=0.01
run bal_bias "" --nproc 2 "${moe[@]}" "${ep[@]}" --set model.moe.aux_loss_coef=0 --set model.moe.bias_update_rate=0.001
run bal_none "" --nproc 2 "${moe[@]}" "${ep[@]}" --set model.moe.aux_loss_coef=0
BENCH_MODEL=$MODEL BENCH_FFN=$FFN python3 - "$W" "$H" "$L" "$T" "$B" "$E" "$K" <<'PY'
import json, os, re, sys
w, H, L, T, B, E, K = sys.argv[1], *map(int, sys.argv[2:])
def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()][1:]
def tps(name):
    r = rows(name)
    return sum(x["tokens_per_second"] for x in r) / len(r)
print(f"{os.environ.get('BENCH_MODEL', 'gpt')} {L} x {H}, seq {T}, batch {B}; MoE: {E} experts, top-{K}, expert FFN {os.environ.get('BENCH_FFN', 4 * H)}")
print(f"{'run':44s} {'tokens/s':>10s} {'step s':>8s} {'comm s':>8s}")
for name, label in [("moe_1p2t", "MoE, 1 process x 2 threads"), ("moe_ep2", "MoE, ep=2 (2 processes x 1 thread)"),
                    ("moe_dp2", "MoE, dp=2 without ep"), ("dense_1p2t", "dense GPT of the same active FFN, 1 x 2")]:
    r = rows(name)
    print(f"{label:44s} {tps(name):10.0f} {sum(x['step_seconds'] for x in r)/len(r):8.3f} "
          f"{sum(x['comm_seconds'] for x in r)/len(r):8.3f}")
# All-to-all payload: rank 0's share of the global batch (B/2 sequences) sends
# k x tokens x H x 4 bytes per MoE layer each way in forward and again in
# backward, of which the half going to its own experts stays local.
tokens_rank = B // 2 * T
theory = 2 * 2 * K * tokens_rank * H * 4 * L / 2
ep_rows = rows("moe_ep2")
a2a = sum(x.get("comm_bytes_ep_all_to_all", 0) for x in ep_rows) / len(ep_rows)
print(f"ep=2 all-to-all bytes sent per step by rank 0 (comm_bytes_ep_all_to_all): {a2a/2**20:.2f} MiB; theory "
      f"(2 exchanges x fwd+bwd x k x tokens x hidden x 4 B x layers, half of it local): {theory/2**20:.2f} MiB; "
      f"all groups together {sum(x['comm_bytes'] for x in ep_rows)/len(ep_rows)/2**20:.2f} MiB")
# Parameter bytes per rank, measured: AdamW keeps 2 state tensors per parameter.
p1 = rows("moe_1p2t")[-1]["optimizer_state_bytes"] / 2
p2 = rows("moe_ep2")[-1]["optimizer_state_bytes"] / 2
expert_all = E * (2 * H * 4 * H + 4 * H + H) * 4 * L
print(f"parameter bytes on rank 0: ep=1 {p1/2**20:.2f} MiB, ep=2 {p2/2**20:.2f} MiB; the experts' share "
      f"(all {E}: {expert_all/2**20:.2f} MiB) drops by {(p1 - p2)/2**20:.2f} MiB = {(p1 - p2)/expert_all:.3f} of it "
      f"(target 1/ep = 0.5 per rank)")
print("load imbalance: max over mean tokens per expert, the worst layer, per step")
print(f"{'balancing':12s} {'first half':>12s} {'second half':>12s} {'last':>8s}")
for name in ("bal_aux", "bal_bias", "bal_none"):
    imb = [x.get("moe_load_imbalance_max", 0) for x in rows(name)]
    h = len(imb) // 2
    print(f"{name[4:]:12s} {sum(imb[:h])/h:12.3f} {sum(imb[h:])/(len(imb)-h):12.3f} {imb[-1]:8.3f}")
PY
