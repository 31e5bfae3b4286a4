#!/usr/bin/env bash
# Issue #22's fault, made deterministic: rank 1 dies (SIGKILL at the fault
# point checkpoint.after_files) inside a background save, so rank 0's
# committer waits for a part that never comes. The ranks are started
# without a launcher (RANK, WORLD_SIZE, MASTER_* as torchrun sets them), and
# rank 0 gets SIGTERM as soon as rank 1 is gone, as a launcher sends it.
# Rank 0 may then be training, blocked at its next save behind the waiting
# committer, or already failing on the lost peer: in every case it must end
# within a liveness bound of 10 s (not a timing), with exit 143 and its stop
# line (which says the save was abandoned), or exit 1 and its failure line
# (the save abandoned on the way out: the run's end no longer waits for it).
# The save of step 6 is never committed and `latest` still names step 4,
# which verifies. (Without a launcher's SIGTERM a rank blocked behind the
# committer waits, as before, until distributed.timeout_seconds.)
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
args=(--set checkpoint.interval=2 --set features.sharded_checkpoint.enabled=true
      --set features.sharded_checkpoint.async=true --set distributed.timeout_seconds=120)
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${args[@]}" --set training.max_steps=4 --set run.output_dir="$WORK/base" \
  > "$WORK/base.log" 2>&1 || { tail -20 "$WORK/base.log"; fail "the run to step 4"; }
[[ "$(cat "$WORK/base/checkpoints/latest")" == step_00000004 ]] || fail "no step 4 checkpoint"

for case in sigterm; do
  rm -rf "$WORK/$case" && cp -r "$WORK/base" "$WORK/$case"
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  start() {  # start RANK [ENV...] &: one worker resuming from step 4, as a launcher starts it (exec: $! is its pid)
    local r=$1; shift
    exec env RANK="$r" WORLD_SIZE=2 LOCAL_RANK="$r" LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
      HP_INTRA_OP_THREADS=1 "$@" "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set training.max_steps=40 \
      --set run.output_dir="$WORK/$case" > "$WORK/$case.rank$r.log" 2>&1
  }
  start 0 & r0=$!
  start 1 HP_FAULT_INJECT=checkpoint.after_files & r1=$!
  wait "$r1"; rc1=$?
  [[ $rc1 -eq 137 ]] || { tail -5 "$WORK/$case.rank1.log"; fail "$case: rank 1 was not killed at the fault point (exit $rc1)"; }
  kill -TERM "$r0" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$r0" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$r0" 2>/dev/null; then
    kill -9 "$r0"; tail -5 "$WORK/$case.rank0.log"
    fail "$case: rank 0 did not end within 10 s of its SIGTERM (it waits for the abandoned save)"
  fi
  wait "$r0"; rc0=$?
  case $rc0 in
    143) want="hp-train: rank 0 stopped by SIGTERM from .*; exit code 143$" ;;
    1) want="hp-train: rank 0 failed: " ;;
    *) tail -5 "$WORK/$case.rank0.log"; fail "$case: rank 0 exit $rc0" ;;
  esac
  line=$(grep -m1 -E "$want" "$WORK/$case.rank0.log") \
    || { tail -5 "$WORK/$case.rank0.log"; fail "$case: rank 0 ended (exit $rc0) without the line '$want'"; }
  [[ "$(cat "$WORK/$case/checkpoints/latest")" == step_00000004 ]] || fail "$case: latest moved: $(cat "$WORK/$case/checkpoints/latest")"
  [[ ! -e "$WORK/$case/checkpoints/step_00000006" ]] || fail "$case: the abandoned save of step 6 was committed"
  "$BIN/hp-ckpt" verify "$WORK/$case/checkpoints" > /dev/null || fail "$case: latest does not verify"
  echo "$case: rank 0 exit $rc0: ${line:0:220}"
done
echo PASS
