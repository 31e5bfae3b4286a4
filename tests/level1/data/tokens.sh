#!/usr/bin/env bash
# A prepared corpus (data.type tokens: SentencePiece trained on a fortune
# file, shards cut at every '%') against one process (docs/PARITY.md bars):
# dp=2, tp=2 with sequence parallel, pp=2; the reference's step-10
# checkpoint resumed at the same layout bitwise (B2), and at tp=2 reading
# the same next sequences (the step-12 batches compared token by token) and
# continuing within the resume bar;
# a blend of two corpora (weights 0.3 / 0.7) at dp=2 against one process.
# With data.document_attention (attention inside each document): block
# attention, cp=2 (ring attention), tp=2 with sequence parallel and pp=2
# against one process's eager attention; selective recompute (attention
# replayed in backward) bitwise; and the option changes the numbers.
# model.vocab_size is left unset: it follows the tokenizer.
source "$(dirname "$0")/../combinations/lib.sh"
BIN=$1
IN=/usr/share/games/fortunes
"$BIN/hp-data" train-tokenizer --input "$IN/computers" --vocab-size 512 --out "$WORK/sp.model" --threads 1 > /dev/null \
  || fail "train-tokenizer"
for src in computers science; do
  "$BIN/hp-data" prepare --input "$IN/$src" --tokenizer "$WORK/sp.model" --split-on % --shard-mb 0.05 \
    --out "$WORK/$src" > "$WORK/prepare_$src.log" 2>&1 || { cat "$WORK/prepare_$src.log"; fail "prepare $src"; }
done
CONFIG="$WORK/c.yaml"
small_config "$CONFIG"
sed -i 's/, vocab_size: 64//; s|^data: .*|data: {type: tokens, path: '"$WORK"'/computers}|' "$CONFIG"
# shellcheck disable=SC2046
{
run ref 1 "" --set checkpoint.interval=10 --set 'training.dump_activations_steps=[12]'
grep -q "vocab_size: 512" "$WORK/ref/config.yaml" 2> /dev/null || grep -rq "vocab_size: 512" "$WORK/ref"/*.yaml \
  || fail "model.vocab_size did not follow the tokenizer (512)"
run dp2 2 "dp=2"
run tp2 2 "dp=1 tp=2" $(tp 2) $(sp)
run pp2 2 "pp=2 dp=1" $(pp 2)
run refr 1 "" --set checkpoint.resume="$WORK/ref/checkpoints/step_00000010"
run tp2r 2 "dp=1 tp=2" $(tp 2) $(sp) --set checkpoint.resume="$WORK/ref/checkpoints/step_00000010" \
  --set 'training.dump_activations_steps=[12]'
blend=(--set "data.blend=[{path: $WORK/computers, weight: 0.3}, {path: $WORK/science, weight: 0.7}]")
run bref 1 "" "${blend[@]}"
run bdp2 2 "dp=2" "${blend[@]}"
doc=(--set data.document_attention=true)
run dref 1 "" "${doc[@]}"
run dblk 1 "" "${doc[@]}" $(blk)
run dcp2 2 "" "${doc[@]}" --set features.context_parallel.enabled=true --set features.context_parallel.size=2 \
  --set features.context_parallel.block=5
run dtp2 2 "dp=1 tp=2" "${doc[@]}" $(tp 2) $(sp)
run dpp2 2 "pp=2 dp=1" "${doc[@]}" $(pp 2)
run drc 1 "" "${doc[@]}" $(rc selective)
}
parity ref dp2 "data parallel"
parity ref tp2 "tensor x sequence parallel"
parity ref pp2 "pipeline, 1f1b"
resumed_within ref 11 tp2r
resumed_bitwise ref refr 11
# The step-12 batches (every rank's micro-batches, whole sequences) of the
# reference and of the resumed tp=2 run: the same tokens and labels.
python3 - "$WORK/ref" "$WORK/tp2r" <<'PY' || fail "the resumed run read other sequences"
import glob, json, struct, sys
def batch(run):
    out = {}
    for f in sorted(glob.glob(run + "/activations_step12/*.safetensors")):
        data = open(f, "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        for k, v in json.loads(data[8:8 + n]).items():
            if k.startswith("batch:"):
                a, b = v["data_offsets"]
                out.setdefault(k, data[8 + n + a:8 + n + b])
    return out
ref, res = batch(sys.argv[1]), batch(sys.argv[2])
assert ref, "no batch recorded in " + sys.argv[1]
assert ref == res, "batches differ: %s" % sorted(set(ref) ^ set(res)) or "same names, other tokens"
print("step-12 batches equal: %d tensors" % len(ref))
PY
grep -q "science" "$WORK/bref.log" || fail "the blend run does not describe its second corpus"
parity bref bdp2 "blend of two corpora, data parallel"
python3 - "$WORK/ref" "$WORK/dref" <<'PY' || fail "data.document_attention did not change the losses"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(r + "/metrics.jsonl") if l.strip()] for r in sys.argv[1:])
print("step-20 loss: causal %.6f, inside documents %.6f" % (a[-1], b[-1]))
sys.exit(0 if a[0] != b[0] and a[-1] != b[-1] else 1)
PY
parity dref dblk "documents: block attention against eager"
parity dref dcp2 "documents: context parallel (ring attention)"
parity dref dtp2 "documents: tensor x sequence parallel"
parity dref dpp2 "documents: pipeline, 1f1b"
replayed_every_step "$WORK/drc" || fail "selective recompute did not run"
bitwise dref drc "documents: selective recompute"
finish
