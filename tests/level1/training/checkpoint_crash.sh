#!/usr/bin/env bash
# A worker killed while writing a checkpoint leaves `latest` on the previous
# complete checkpoint, which loads and trains on.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
out="$WORK/run"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set training.max_steps=5 --set run.output_dir="$out" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "first run"; }
[[ "$(cat "$out/checkpoints/latest")" == "step_00000005" ]] || fail "latest after first run: $(cat "$out/checkpoints/latest")"
for stage in after_files before_rename before_latest; do
  HP_FAULT_INJECT=checkpoint:$stage "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set training.max_steps=10 \
    --set run.output_dir="$out" > "$WORK/log" 2>&1 && fail "$stage: the run did not die"
  grep -q "killed by signal 9" "$WORK/log" || { cat "$WORK/log"; fail "$stage: no SIGKILL reported"; }
  latest=$(cat "$out/checkpoints/latest")
  echo "$stage: latest = $latest"
  # before_latest has already renamed step 10 into place but not moved latest.
  [[ "$latest" == "step_00000005" ]] || fail "$stage: latest moved to $latest"
done
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set training.max_steps=10 --set run.output_dir="$out" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "recovery run"; }
grep -q "resumed from .*step_00000005 at step 5" "$WORK/log" || { cat "$WORK/log"; fail "did not resume from step 5"; }
[[ "$(cat "$out/checkpoints/latest")" == "step_00000010" ]] || fail "recovery did not commit step 10"
echo PASS
