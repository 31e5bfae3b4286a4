#!/usr/bin/env bash
# hp-train --nproc N starts its workers as forks of itself (LibTorch and the
# plugins already loaded) and HP_LAUNCH_EXEC=1 as exec'd copies: both start
# lines say which, the two runs are bitwise the same (losses, gradients of
# step 1), and a rank that throws in a forked worker is named by the
# launcher with its exit code and its message, the other rank stopped.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
PLUGINS="$BIN/../tests/plugins"
small_config "$WORK/c.yaml"
args=(--nproc 2 --set training.max_steps=6 --set training.dump_grads_at_step=1)
"$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/forked" > "$WORK/forked.log" 2>&1 \
  || { tail -20 "$WORK/forked.log"; fail "the forked run"; }
HP_LAUNCH_EXEC=1 "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/exec" > "$WORK/exec.log" 2>&1 \
  || { tail -20 "$WORK/exec.log"; fail "the exec'd run"; }
grep -E "^hp-launch: workers started \(forked from this process\): rank 0 pid [0-9]+, rank 1 pid [0-9]+$" "$WORK/forked.log" \
  || fail "the default run's workers were not forked (or the launcher did not list their pids)"
grep -E "^hp-launch: workers started \(exec'd\): rank 0 pid [0-9]+, rank 1 pid [0-9]+$" "$WORK/exec.log" \
  || fail "HP_LAUNCH_EXEC=1 did not exec the workers"
# A forked rank reads its place from the environment the launcher gave it.
grep -q "launch: hp-launch: rank 0 of 2, local 0 of 2" "$WORK/forked.log" || fail "rank 0's start line"
"$BIN/hp-compare" "$WORK/exec" "$WORK/forked" --exact --grads-step 1 --grad-rtol 0 --phase "forked workers" \
  || fail "forked workers differ from exec'd ones"
# A forked worker that throws: its rank, exit code and message reach the summary.
"$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set "plugins.path=[$PLUGINS]" --set features.test_faults.enabled=true \
  --set features.test_faults.throw_at_step=3 --set features.test_faults.throw_rank=1 \
  --set run.output_dir="$WORK/throw" > "$WORK/throw.log" 2>&1 && fail "the run with a throwing rank succeeded"
grep -q "workers started (forked from this process)" "$WORK/throw.log" || fail "the throwing run was not forked"
grep -qE "^hp-launch: rank 1 \(pid [0-9]+\) failed: exit code 1$" "$WORK/throw.log" \
  || { tail -20 "$WORK/throw.log"; fail "the launcher does not name rank 1 with exit code 1"; }
grep -q "hp-train: rank 1 failed: " "$WORK/throw.log" || { tail -20 "$WORK/throw.log"; fail "rank 1's message"; }
grep -E "^hp-launch: rank 1 \(pid|hp-train: rank 1 failed" "$WORK/throw.log" | cut -c1-200
echo PASS
