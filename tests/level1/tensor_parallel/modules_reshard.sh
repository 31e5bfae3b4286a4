#!/usr/bin/env bash
# Checkpoints stay layout-free under per-module degrees. A sharded checkpoint
# of attention 2 / FFN 4 / embedding 4 / LM head 4 (4 ranks) resumes at one
# process and at uniform tp = 2 with the losses of the uninterrupted run
# (within 1e-4), and at its own layout bitwise; a uniform tp = 2 checkpoint
# resumes at the per-module layout (within 1e-4). hp-ckpt writes the
# per-module checkpoint's per-rank weights at another per-module layout.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
P=features.tensor_parallel
common=(--set model.vocab_size=66 --set training.max_steps=40 --set features.sharded_checkpoint.enabled=true)
mods=(--set $P.enabled=true --set $P.size=2 --set $P.ffn_size=4 --set $P.embedding_size=4 --set $P.lm_head_size=4)
uniform=(--set $P.enabled=true --set $P.size=2)
run mods 4 "${mods[@]}" --set checkpoint.interval=20
ck="$WORK/mods/checkpoints/step_00000020"
[[ -d "$ck" ]] || fail "no step-20 checkpoint"
run mods_again 4 "${mods[@]}" --set checkpoint.resume="$ck"
run one 1 --set checkpoint.resume="$ck"
run tp2 2 "${uniform[@]}" --set checkpoint.resume="$ck"
grep -q "resumed from .* at step 20" "$WORK/one.log" || fail "one process did not resume"
resumed_bitwise mods mods_again 21
resumed_within mods 21 one tp2
# The other way round: a uniform tp = 2 checkpoint resumed per module.
run utp2 2 "${uniform[@]}" --set checkpoint.interval=20
run utp2_mods 4 "${mods[@]}" --set checkpoint.resume="$WORK/utp2/checkpoints/step_00000020"
resumed_within utp2 21 utp2_mods
# Offline: the per-module checkpoint's weights per rank at FFN 2 x 2 over 4
# ranks of tp 1 (attention data-parallel), each slice as the layout cuts it.
"$BIN/hp-ckpt" convert "$ck" --to "$WORK/per_rank" --per-rank --tp 1 --dp 4 --size ffn_tp_inner=1 \
  --size ffn_tp_outer=4 --size embed_tp_inner=1 --size embed_tp_outer=2 --size head_tp_inner=1 \
  --size head_tp_outer=2 > "$WORK/convert.log" 2>&1 || { cat "$WORK/convert.log"; fail "hp-ckpt --per-rank"; }
cat "$WORK/convert.log"
"$BIN/hp-ckpt" convert "$ck" --to "$WORK/whole" --consolidate > /dev/null || fail "hp-ckpt --consolidate"
python3 - "$WORK" <<'PY' || fail "per-rank slices are not the per-module layout's"
import json, struct, sys
from array import array
def load(path):  # name -> (shape, floats)
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        out[k] = (v["shape"], array("f", raw[8 + n + a:8 + n + b]))
    return out
def rows(t, lo, hi):  # rows [lo, hi) of a 2-d tensor
    (r, c), x = t
    return x[lo * c:hi * c]
def cols(t, lo, hi):  # columns [lo, hi)
    (r, c), x = t
    return array("f", [x[i * c + j] for i in range(r) for j in range(lo, hi)])
w = load(sys.argv[1] + "/whole/model.safetensors")
for r in range(4):
    mine = {k: t[1] for k, t in load("%s/per_rank/rank%05d/model.safetensors" % (sys.argv[1], r)).items()}
    f = w["blocks.0.mlp.fc1.weight"][0][0] // 4  # FFN split 4 ways: rank r holds piece r
    assert mine["blocks.0.mlp.fc1.weight"] == rows(w["blocks.0.mlp.fc1.weight"], r * f, (r + 1) * f), r
    assert mine["blocks.0.mlp.fc2.weight"] == cols(w["blocks.0.mlp.fc2.weight"], r * f, (r + 1) * f), r
    v = w["embed.tok.weight"][0][0] // 2  # embedding 2 ways: piece r % 2
    assert mine["embed.tok.weight"] == rows(w["embed.tok.weight"], (r % 2) * v, (r % 2 + 1) * v), r
    assert mine["blocks.0.attn.qkv.weight"] == w["blocks.0.attn.qkv.weight"][1], r  # attention whole
print("per-rank weights: FFN piece r of 4, embedding piece r % 2 of 2, attention whole, on each of 4 ranks")
PY
echo PASS
