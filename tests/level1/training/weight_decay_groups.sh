#!/usr/bin/env bash
# Weight-decay groups (optimizer.groups, optimizer.weight_decay_on) through
# data parallel and every ZeRO stage, and across resumes:
#   the groups change the numbers (a run without them leaves the bar), and a
#   dp=2 run under ZeRO stage 2 with the same groups follows one process at
#   the bar (every optimizer applies each parameter's group);
#   the step-10 checkpoint records the groups (hp-ckpt inspect) and resumes
#   at dp=2 under ZeRO stage 3 and at tp=2 within the resume bar;
#   a checkpoint written before groups existed (its config.yaml lacks
#   optimizer.weight_decay_on) resumes decaying every parameter, logged, and
#   follows a run that decays every parameter bitwise.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
sed -i 's/^model: .*/model: {type: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 96, seq_len: 32, vocab_size: 64}/' "$WORK/c.yaml"
sed -i 's/^optimizer: .*/optimizer: {type: adamw, lr: 0.002, warmup_steps: 2, grad_clip: 1.0, weight_decay: 0.5}/' "$WORK/c.yaml"
export HP_INTRA_OP_THREADS=1
common=(--set training.dump_grads_at_step=1)
groups=(--set 'optimizer.groups=[{match: "*.ln*", weight_decay: 0.2, name: norms}, {match: "embed*", lr_scale: 0.3}]')
zero() { echo --set features.zero.enabled=true --set features.zero.stage="$1"; }
run ref 1 "${groups[@]}" --set checkpoint.interval=10
grep -q "optimizer groups (weight_decay 0.5 on matrices; norms (\*.ln\*: weight_decay 0.2); groups\[1\] (embed\*: lr_scale 0.3)): decay 15 tensors (65536 values), groups\[1\] 1 tensors (4096 values), norms 5 tensors" \
  "$WORK/ref.log" || { grep "optimizer groups" "$WORK/ref.log"; fail "the groups line is missing or wrong"; }
run plain 1
if "$BIN/hp-compare" "$WORK/ref" "$WORK/plain" --first-loss-rtol 1e-5 --loss-rtol 1e-4 > "$WORK/cmp" 2>&1; then
  fail "a run without the groups follows the run with them: the check below could not fail"
fi
# shellcheck disable=SC2046
run z2 2 "${groups[@]}" $(zero 2)
compare_b4 ref z2 "weight-decay groups under dp=2 x zero stage 2"

ck="$WORK/ref/checkpoints/step_00000010"
"$BIN/hp-ckpt" inspect "$ck" > "$WORK/inspect" || fail "hp-ckpt inspect"
grep -qF "optimizer    weight_decay 0.5 on matrices; norms (*.ln*: weight_decay 0.2); groups[1] (embed*: lr_scale 0.3)" \
  "$WORK/inspect" || { cat "$WORK/inspect"; fail "inspect does not show the groups"; }
# shellcheck disable=SC2046
run z3 2 "${groups[@]}" $(zero 3) --set checkpoint.resume="$ck"
run tp2 2 "${groups[@]}" --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set checkpoint.resume="$ck"
resumed_within ref 11 z3 tp2

echo "== a checkpoint from before groups existed"
run all 1 --set optimizer.weight_decay_on=all --set checkpoint.interval=10
old="$WORK/old/step_00000010"
mkdir -p "$WORK/old" && cp -r "$WORK/all/checkpoints/step_00000010" "$old"
sed -i '/weight_decay_on:/d; /^  groups:/d' "$old/config.yaml"
grep -q "weight_decay_on" "$old/config.yaml" && fail "could not make the old config"
python3 "$(dirname "$0")/../../lib/reseal_config.py" "$old" || fail "could not reseal the edited config"
run resumed_old 1 --set checkpoint.resume="$old"
grep -q "was written before weight-decay groups existed: resuming with weight decay on every parameter" \
  "$WORK/resumed_old.log" || { grep -i "resum\|groups" "$WORK/resumed_old.log"; fail "the old behaviour was not logged"; }
grep -q "optimizer groups (weight_decay 0.5 on all)" "$WORK/resumed_old.log" || fail "the old checkpoint did not resume decaying all"
resumed_bitwise all resumed_old 11
echo PASS
