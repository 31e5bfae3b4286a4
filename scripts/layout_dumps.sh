#!/usr/bin/env bash
# Gradient dumps of every layout and ZeRO stage, for checking that a change
# to the reduction or the optimizer leaves the numbers alone:
#   scripts/layout_dumps.sh run  OUT_DIR [BIN]   # 6-step runs, step-3 gradients
#   scripts/layout_dumps.sh compare BEFORE AFTER [BIN]
# compare runs hp-compare --exact (losses and every step-3 gradient bitwise)
# per layout and prints one line each. Same machine and kernel only: bits
# computed elsewhere are not comparable (docs/PARITY.md).
set -uo pipefail
mode=$1; shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
layouts() {
  local tp="--set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2"
  local pp="--set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2"
  local ep="--set features.expert_parallel.enabled=true --set features.expert_parallel.size=2"
  local cp="--set features.context_parallel.enabled=true --set features.context_parallel.size=2"
  local moe="--set model.moe.num_experts=4"
  local z="--set features.zero.enabled=true --set features.zero.stage"
  cat <<L
one 1
dp2 2
tp2sp 2 $tp --set features.tensor_parallel.sequence_parallel=true
tp2dp2 4 $tp
pp2dp2 4 $pp
cp2 2 $cp
cp2dp2 4 $cp
ep2 2 $moe $ep
ep2dp2 4 $moe $ep
z1 2 $z=1
z2 2 $z=2 --set features.zero.reduce_per_micro_batch=false
z3 2 $z=3 --set features.zero.reduce_per_micro_batch=false
z3pmb 2 $z=3 --set features.zero.reduce_per_micro_batch=true
z1tp2sp 4 $z=1 $tp --set features.tensor_parallel.sequence_parallel=true
z2cp2dp2 4 $z=2 $cp --set features.zero.reduce_per_micro_batch=false
z3cp2dp2 4 $z=3 $cp --set features.zero.reduce_per_micro_batch=false
z2ep2dp2 4 $z=2 $moe $ep --set features.zero.reduce_per_micro_batch=false
z3pp2dp2 4 $z=3 $pp --set features.zero.reduce_per_micro_batch=false
L
}
case $mode in
  run)
    OUT=$1; BIN=${2:-$ROOT/build/bin}
    mkdir -p "$OUT"
    cat > "$OUT/config.yaml" <<'YAML'
run: {seed: 7}
model: {type: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab_size: 64, dropout: 0.1}
data: {type: synthetic}
training: {max_steps: 6, global_batch_size: 8, micro_batch_size: 2, log_interval: 1, dump_grads_at_step: 3}
optimizer: {type: adamw, lr: 0.002, warmup_steps: 2, grad_clip: 1.0}
checkpoint: {interval: 0}
metrics: {peak_flops: 1.0e+10}
YAML
    while read -r name n args; do
      # shellcheck disable=SC2086
      "$BIN/hp-train" "$OUT/config.yaml" --nproc "$n" $args --set run.output_dir="$OUT/$name" \
        > "$OUT/$name.log" 2>&1 || { echo "FAIL: $name (see $OUT/$name.log)"; continue; }
      echo "ran $name"
    done < <(layouts)
    ;;
  compare)
    A=$1; B=$2; BIN=${3:-$ROOT/build/bin}; bad=0
    while read -r name n args; do
      if "$BIN/hp-compare" "$A/$name" "$B/$name" --exact --grads-step 3 --grad-rtol 0 > "$B/$name.cmp" 2>&1; then
        echo "bitwise  $name"
      else
        echo "DIFFERS  $name: $(grep -m1 -iE 'fail|differ|exceed' "$B/$name.cmp")"; bad=1
      fi
    done < <(layouts)
    exit $bad
    ;;
  *) echo "usage: $0 run OUT [BIN] | compare BEFORE AFTER [BIN]" >&2; exit 2 ;;
esac
