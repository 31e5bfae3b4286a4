#!/usr/bin/env bash
# A worker killed while writing a checkpoint (HP_FAULT_INJECT's
# checkpoint.after_files, checkpoint.before_rename, checkpoint.before_latest)
# leaves `latest` on the previous complete checkpoint, which loads and
# trains on, bitwise equal to one uninterrupted run of the same config,
# layout and checkpoint cadence.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
args=(--nproc 2 --set training.max_steps=10 --set checkpoint.interval=5)
"$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/ref" > "$WORK/log" 2>&1 \
  || { cat "$WORK/log"; fail "uninterrupted run"; }
# The chain starts from the uninterrupted run's committed step 5.
out="$WORK/run"
mkdir -p "$out/checkpoints"
cp -r "$WORK/ref/checkpoints/step_00000005" "$out/checkpoints/"
echo step_00000005 > "$out/checkpoints/latest"
for stage in after_files before_rename before_latest; do
  HP_FAULT_INJECT=checkpoint.$stage "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" \
    --set run.output_dir="$out" > "$WORK/log" 2>&1 && fail "$stage: the run did not die"
  grep -q "resumed from .*step_00000005 at step 5" "$WORK/log" || { cat "$WORK/log"; fail "$stage: did not resume"; }
  grep -q "killed by signal 9" "$WORK/log" || { cat "$WORK/log"; fail "$stage: no SIGKILL reported"; }
  latest=$(cat "$out/checkpoints/latest")
  echo "$stage: latest = $latest"
  # before_latest has already renamed step 10 into place but not moved latest.
  [[ "$latest" == "step_00000005" ]] || fail "$stage: latest moved to $latest"
done
"$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set checkpoint.dir="$out/checkpoints" --set run.output_dir="$WORK/rec" \
  > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "recovery run"; }
grep -q "resumed from .*step_00000005 at step 5" "$WORK/log" || { cat "$WORK/log"; fail "did not resume from step 5"; }
[[ "$(cat "$out/checkpoints/latest")" == "step_00000010" ]] || fail "recovery did not commit step 10"
"$BIN/hp-compare" "$WORK/ref" "$WORK/rec" --exact --from-step 6 --phase "resume after the kills" > "$WORK/cmp" \
  || { cat "$WORK/cmp"; fail "the recovered run is not bitwise the uninterrupted one"; }
grep -q "^compared 5 steps" "$WORK/cmp" || { cat "$WORK/cmp"; fail "steps 6-10 not all compared"; }
echo "HP_FAULT_INJECT with an unknown point is refused before anything starts"
HP_FAULT_INJECT=checkpoint:after_files "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/bad" \
  > "$WORK/log" 2>&1
rc=$?
[[ $rc -eq 2 ]] || { cat "$WORK/log"; fail "unknown fault point: exit $rc, expected 2"; }
grep -q "config error: HP_FAULT_INJECT = checkpoint:after_files: names an unknown fault point: checkpoint:after_files (legal: checkpoint.after_files, checkpoint.before_rename, checkpoint.before_latest, checkpoint.async_write" "$WORK/log" \
  || { cat "$WORK/log"; fail "the refusal does not name the point and the legal list"; }
[[ ! -e "$WORK/bad" ]] || fail "a process started although the fault point was refused"
echo PASS
