#!/usr/bin/env bash
# context_parallel's rules before any process starts (hp-train --dry-run):
# the mesh it claims is printed; a size that does not divide the world, a
# sequence length not divisible by 2 x size, and a model without a sequence
# are refused verbatim with exit 2.
HP_TRAIN=$1
source "$(dirname "$0")/../../lib/dry_run.sh"
cat > "$dir/c.yaml" <<'YAML'
model: {type: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab_size: 64}
data: {type: synthetic}
training: {max_steps: 3, global_batch_size: 8, micro_batch_size: 2}
features: {context_parallel: {enabled: true}}
YAML
out=$("$HP_TRAIN" "$dir/c.yaml" --nproc 4 --dry-run 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "dry-run exit $rc: $out"
grep -q "mesh dp=2 cp=2 (world 4)" <<<"$out" || fail "no dp=2 cp=2 mesh in: $out"
refused "features.context_parallel.size = 3: must divide the world size 2 (legal: a divisor of 2)" 2 \
  --set features.context_parallel.size=3
refused "features.context_parallel.size = 2: needs the sequence length = 30 (model.seq_len) divisible by 2 x size = 4 (legal: a size whose double divides 30)" \
  2 --set model.seq_len=30
refused "features.context_parallel.size = 2: model 'unet' is not a sequence model with attention (context parallel splits the positions that attention connects) (legal: disable features.context_parallel for model unet)" \
  2 --set model.type=unet --set data.type=field
echo PASS
