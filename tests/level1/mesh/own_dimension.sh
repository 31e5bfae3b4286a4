#!/usr/bin/env bash
# A feature's own mesh dimension and view, end to end, with no change outside
# the feature's folder (the test_dims fixture plugin: "xt" split over 2 ranks
# and a view "xv" refactoring xt x dp into xu x xr; its column layers are
# placed over xu). At 4 processes (xt=2 x dp=2) the run against one process:
# first-step loss and every gradient (reassembled by global name) within
# 1e-5, later losses, norms and eval within 1e-4 (docs/PARITY.md) — so its
# groups, the gradient sum over xr the mesh derives from the view, and the
# global norm over xu are right. Its sharded checkpoint records the mesh and
# the xu placements; hp-ckpt re-shards it over xt by name (--size xt=1 --dp 2)
# and a plain dp=2 run resumes from the result with the same losses as
# resuming the original (any layout reads any).
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
PLUGINS=$2
small_config "$WORK/c.yaml"
common=(--set training.dump_grads_at_step=1 --set training.max_steps=12)
own=(--set "plugins.path=[$PLUGINS]" --set features.test_dims.enabled=true --set features.test_dims.size=2)
run() {  # name nproc [extra args]
  local name=$1 n=$2
  shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${common[@]}" --set run.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "run $name"; }
}
run ref 1
run own 4 "${own[@]}" --set features.sharded_checkpoint.enabled=true --set checkpoint.interval=6
grep -q "mesh dp=2 xt=2 xu=2 xr=2 over 4 ranks" "$WORK/own.log" \
  || { grep mesh "$WORK/own.log" | head -3; fail "the mesh line does not show dp=2 xt=2 and the view's xu=2 xr=2"; }
plan=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 4 "${own[@]}" --dry-run 2>&1) || fail "--dry-run: $plan"
grep -q "view xv over xt x dp: xu = 2 split; xr = 2 replicate; (test_dims)" <<<"$plan" \
  || { grep -A3 "^mesh" <<<"$plan"; fail "--dry-run does not describe the plugin's view"; }
echo "== xt=2 x dp=2 against one process"
"$BIN/hp-compare" "$WORK/ref" "$WORK/own" --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --grad-rtol 1e-5 \
  --phase "the plugin's own dimension" || fail "parity of the plugin's own dimension"

step="$WORK/own/checkpoints/step_00000006"
"$BIN/hp-ckpt" verify "$step" || fail "the checkpoint does not verify"
python3 - "$step/manifest.json" <<'PY' || fail "the manifest does not record the mesh and the xu placements"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["format_version"] == 2, m["format_version"]
dims = {d["name"]: d for d in m["mesh"]["dims"]}
assert dims["xt"]["role"] == "split" and dims["xt"]["by"] == "test_dims", dims
view = m["mesh"]["views"][0]
assert view["name"] == "xv" and [d["name"] for d in view["dims"]] == ["xu", "xr"], view
placed = [n for n, t in m["tensors"].items() if t.get("placements") == [{"dim": "xu", "placement": "S(0)"}]]
assert any(n.endswith("fc1.weight") for n in placed), placed
PY
"$BIN/hp-ckpt" convert "$step" --to "$WORK/re" --size xt=1 --dp 2 > "$WORK/convert.log" 2>&1 \
  || { cat "$WORK/convert.log"; fail "hp-ckpt convert over the plugin's dimension"; }
cat "$WORK/convert.log"
"$BIN/hp-ckpt" verify "$WORK/re" || fail "the re-sharded checkpoint does not verify"
run from_own 2 --set checkpoint.resume="$step" --set checkpoint.interval=0
run from_re 2 --set checkpoint.resume="$WORK/re" --set checkpoint.interval=0
"$BIN/hp-compare" "$WORK/from_own" "$WORK/from_re" --from-step 7 --exact --phase "hp-ckpt re-shard" \
  || fail "resuming hp-ckpt's re-shard differs from resuming the original"
"$BIN/hp-compare" "$WORK/own" "$WORK/from_re" --from-step 7 --first-loss-rtol 1e-5 --loss-rtol 1e-4 \
  --phase "resume at dp=2" || fail "resuming at dp=2 left the 4-process run's losses"
echo PASS
