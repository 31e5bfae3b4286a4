#!/usr/bin/env bash
# A resume against the checkpoint it resumes (checkpoint.strict, the stored
# config.yaml), as a new user meets it:
#  - a 4-layer checkpoint resumed with model.layers=2 is refused before any
#    process starts, exit 2, naming model.layers and both values;
#  - so is a checkpoint missing a file its manifest lists (config.yaml, a
#    shard file), naming the file and saying the checkpoint is incomplete;
#  - changed training/optimizer keys and free model keys are logged in one line;
#  - the same resume from a checkpoint written before configs were stored is
#    refused at the load, by the rank that checks first (each rank checks;
#    the launcher then stops the rest), naming the tensors the run lacks
#    (pp=2: each stage holds only its own blocks, the verdict is the whole model's);
#  - checkpoint.strict: false loads what fits (fine-tuning the smaller model)
#    and lists what it skipped, model and optimizer tensors;
#  - an old checkpoint of the same model loads, saying its config could not
#    be compared.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
four=(--set model.layers=4 --set checkpoint.interval=0)
pp2=(--nproc 2 --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2)
"$BIN/hp-train" "$WORK/c.yaml" "${four[@]}" --set training.max_steps=4 --set run.output_dir="$WORK/a" \
  > "$WORK/a.log" 2>&1 || { tail -20 "$WORK/a.log"; fail "the 4-layer run"; }
ck="$WORK/a/checkpoints/step_00000004"
[[ -f "$ck/config.yaml" ]] || fail "the checkpoint stores no config.yaml"
python3 - "$ck" <<'PY' || fail "the manifest does not list config.yaml with its xxh64"
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
assert m["config_file"] == "config.yaml", m.get("config_file")
assert len(m["config_hash"]) == 16 and all(c in "0123456789abcdef" for c in m["config_hash"]), m["config_hash"]
PY
"$BIN/hp-ckpt" verify "$ck" | grep -q "config.yaml matches its checksum" || fail "hp-ckpt verify does not check config.yaml"

# refused_before_start NAME LINE ARGS...: hp-train ARGS (pp=2, output in
# $WORK/NAME) exits 2 with a line starting with LINE, and starts nothing.
refused_before_start() {
  local name=$1 line=$2 rc; shift 2
  "$BIN/hp-train" "$WORK/c.yaml" "${pp2[@]}" --set training.max_steps=5 "$@" --set run.output_dir="$WORK/$name" \
    > "$WORK/$name.log" 2>&1
  rc=$?
  cat "$WORK/$name.log"
  [[ $rc -eq 2 ]] || fail "$name: exit $rc, expected 2"
  awk -v l="$line" 'index($0, l) == 1 { found = 1 } END { exit !found }' "$WORK/$name.log" \
    || fail "$name: no line starting '$line'"
  [[ ! -e "$WORK/$name" ]] || fail "$name: a process started"
}

echo "== model.layers=2 from the 4-layer checkpoint: refused before start"
refused_before_start b "config error: checkpoint.resume = $ck: the checkpoint was written with other model options (checkpoint -> this run): model.layers 4 -> 2; " \
  --set model.layers=2 --set checkpoint.resume="$ck"

echo "== an incomplete checkpoint (a file its manifest lists deleted): refused before start"
for gone in config.yaml model-rank00000.safetensors; do
  cut="$WORK/cut_${gone%%.*}/step_00000004"
  mkdir -p "$(dirname "$cut")" && cp -r "$ck" "$cut" && rm "$cut/$gone"
  refused_before_start "g_${gone%%.*}" \
    "config error: checkpoint.resume = $cut: checkpoint $cut is incomplete: $gone, listed in its manifest, is missing; resume from another step" \
    --set model.layers=4 --set checkpoint.resume="$cut"
done

echo "== changed training, optimizer and free model keys: logged"
"$BIN/hp-train" "$WORK/c.yaml" "${four[@]}" --set training.max_steps=5 --set optimizer.lr=0.001 \
  --set model.dropout=0.2 --set checkpoint.resume="$ck" --set run.output_dir="$WORK/d" > "$WORK/d.log" 2>&1 \
  || { tail -20 "$WORK/d.log"; fail "the resume with changed training keys"; }
grep "resuming with changed" "$WORK/d.log"
grep -q "resuming with changed training options: optimizer.lr 0.002 -> 0.001, training.max_steps 4 -> 5$" "$WORK/d.log" \
  || fail "the changed training keys are not logged in one line"
grep -q "resuming with changed model options the model declares free to change: model.dropout 0.1 -> 0.2$" "$WORK/d.log" \
  || fail "the changed free model key is not logged"

echo "== the same from a checkpoint without a stored config: refused at the load, naming the tensors"
old="$WORK/old/step_00000004"
mkdir -p "$WORK/old" && cp -r "$ck" "$old"
python3 - "$old" <<'PY'
import json, os, sys
p = sys.argv[1] + "/manifest.json"
m = json.load(open(p))
del m["config_file"]
m["config_hash"] = "8301925345139226411"  # as std::hash of the model keys was
m.pop("checksum_file", None)  # nor did manifests have a checksum then
os.remove(p + ".xxh64")
json.dump(m, open(p, "w"))
os.remove(sys.argv[1] + "/config.yaml")
PY
"$BIN/hp-train" "$WORK/c.yaml" "${pp2[@]}" --set model.layers=2 --set training.max_steps=5 \
  --set checkpoint.resume="$old" --set run.output_dir="$WORK/c" > "$WORK/c.log" 2>&1 && fail "the old checkpoint loaded"
# What the run lacks: blocks 2 and 3, model and optimizer (AdamW: exp_avg, exp_avg_sq).
read -r nmodel noptim < <(python3 - "$old" <<'PY'
import json, re, sys
t = json.load(open(sys.argv[1] + "/manifest.json"))["tensors"]
extra = [n for n in t if re.search(r"(^|/)blocks\.[23]\.", n)]
print(sum("/" not in n for n in extra), sum("/" in n for n in extra))
PY
)
echo "checkpoint tensors of blocks 2-3: $nmodel model, $noptim optimizer"
(( nmodel > 0 && noptim == 2 * nmodel )) || fail "unexpected manifest"
# Every rank checks on its own; the first to refuse makes the launcher stop
# the others, which may not have printed theirs yet (a race, seen in CI).
# So: at least one rank names the extra tensors, and each rank either does
# or was stopped by the launcher.
refused=0
for r in 0 1; do
  if grep -q "rank $r failed: checkpoint $old holds $nmodel model tensors (blocks.2.[a-z_.]*, .* and $noptim optimizer tensors (exp_avg.*) that this run does not have" "$WORK/c.log"; then
    refused=$((refused + 1))
  else
    grep -q "rank $r .*stopped by SIGTERM from hp-train\|rank $r terminated by hp-launch" "$WORK/c.log" \
      || { tail -20 "$WORK/c.log"; fail "rank $r neither refuses naming the extra tensors nor was stopped by the launcher"; }
  fi
done
(( refused >= 1 )) || { tail -20 "$WORK/c.log"; fail "no rank refuses naming the extra tensors"; }
grep "failed: checkpoint" "$WORK/c.log" | head -2

echo "== checkpoint.strict: false: fine-tuning the 2-layer model from the 4-layer checkpoint"
"$BIN/hp-train" "$WORK/c.yaml" "${pp2[@]}" --set model.layers=2 --set training.max_steps=6 --set checkpoint.strict=false \
  --set checkpoint.resume="$ck" --set run.output_dir="$WORK/e" > "$WORK/e.log" 2>&1 \
  || { tail -20 "$WORK/e.log"; fail "the partial load"; }
grep -E "partial load" "$WORK/e.log"
grep -q "partial load (checkpoint.strict: false) with changed model options: model.layers 4 -> 2" "$WORK/e.log" \
  || fail "the partial load does not name the changed model key"
grep -q "partial load from $ck (checkpoint.strict: false): skipped $(( nmodel + noptim )) checkpoint tensors this run does not have (blocks.2.[a-z_.]*, .* and $(( nmodel + noptim - 4 )) more); 0 tensors of this run not in the checkpoint" "$WORK/e.log" \
  || fail "the partial load does not list what it skipped"
grep -q "resumed from .* at step 4" "$WORK/e.log" || fail "the partial load did not resume"
python3 - "$WORK/e/metrics.jsonl" <<'PY' || fail "the partial load does not train"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert [r["step"] for r in rows] == [5, 6] and all(math.isfinite(r["loss"]) for r in rows), rows
PY

echo "== an old checkpoint of the same model loads; its config could not be compared"
"$BIN/hp-train" "$WORK/c.yaml" "${four[@]}" --set training.max_steps=5 --set checkpoint.resume="$old" \
  --set run.output_dir="$WORK/f" > "$WORK/f.log" 2>&1 || { tail -20 "$WORK/f.log"; fail "the old checkpoint"; }
grep -q "checkpoint $old stores no config (written before checkpoints stored theirs): the config could not be compared" \
  "$WORK/f.log" || fail "no line saying the config could not be compared"
echo PASS
